"""Batched model runner: one forward over chunks of several sequences, each at its own position.

The runner owns the tensors (slot KV cache, input/position/mask construction) and nothing
else: it does not know about requests, sampling or speculation. A chunk is whatever the
scheduler decided a sequence feeds this step: a 1-token decode, a k-token verification or
a prefill piece. Chunks are right-aligned so that "the last n positions" of every row are
the same columns, which lets the model compute logits only for the positions asked for
(`logits_to_keep`).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from selfspec.engine import cpu_linear, linear_attention
from selfspec.engine import slot_attention as slot_attention_glue
from selfspec.engine.architecture import check_architecture
from selfspec.engine.attention_mask import build_additive_mask, query_positions
from selfspec.engine.decode_ahead import DecodeAhead
from selfspec.engine.fusion import fused
from selfspec.engine.kv_cache import SlotKVCache, layer_kv_shapes, model_kv_shape
from selfspec.engine.state_cache import SlotStateCache
from selfspec.engine.static_forward import GraphBuckets, StaticForwardPool

if TYPE_CHECKING:
    from selfspec.engine.schedule import ScheduleRecorder


@dataclass
class Chunk:
    """What one sequence feeds in a forward."""

    slot: int
    start: int  # absolute position of token_ids[0]
    token_ids: list[int]
    num_logits: int  # logits wanted for the last `num_logits` tokens (0: none)


@dataclass
class ForwardResult:
    """What one `ModelRunner.run` computed, per chunk (index-aligned with the chunks).

    logits: [num_logits, V] float32, or None (no logits asked, or skipped by `want_logits`).
    argmax: the greedy token at each logits position, already on the host (one device-to-host
      copy per forward serves every row's greedy commit and verification).
    shapes: the forward shape that computed the chunk ("2x8/k2048": batch rows x tokens per row
      / key length, as padded; "eager ..." without static forwards). In bf16 kernels of different
      shapes may round a row differently, so records keep which shape chose each token.
    """

    logits: list[torch.Tensor | None]
    argmax: list[list[int] | None]
    shapes: list[str]


class ModelRunner:
    """Runs the transformers model over slot-cached, mixed-length chunks."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        num_slots: int,
        max_len: int,
        key_length_bucket: int = 32,
        max_padding_ratio: float = 1.5,
        static_shapes: GraphBuckets | None = None,
        capture_graphs: bool = False,
        fused_pointwise: bool = False,
        slot_attention: bool = False,
        static_padding_budget: int = 128,
        state_snapshot_tokens: int | None = None,
        decode_ahead: bool = False,
    ) -> None:
        self.model = model
        self.config = model.config
        text_config = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        if getattr(text_config, "use_bidirectional_attention", False) in (True, "all"):
            raise ValueError("models with bidirectional attention are not causal LMs; the engine cannot serve them")
        check_architecture(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_len = max_len
        self.num_slots = num_slots
        self.key_length_bucket = key_length_bucket
        self.max_padding_ratio = max_padding_ratio
        self.static_padding_budget = static_padding_budget
        num_layers, kv_heads, head_dim = model_kv_shape(self.config)
        layer_types = getattr(text_config, "layer_types", None)
        self.layer_types = sorted(set(layer_types or ["full_attention"]))
        self.sliding_window = getattr(text_config, "sliding_window", None)
        self.has_sliding = bool(layer_types) and "sliding_attention" in layer_types and self.sliding_window is not None
        self.cache = SlotKVCache(
            num_layers=num_layers,
            num_slots=num_slots,
            max_len=max_len,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
            layer_types=layer_types if self.has_sliding else None,
            sliding_window=self.sliding_window if self.has_sliding else None,
            layer_shapes=layer_kv_shapes(self.config),
        )
        # Linear-attention layers (Gated DeltaNet) keep a per-slot state instead of K/V.
        linear_specs = linear_attention.install(model)
        self.state: SlotStateCache | None = None
        if linear_specs:
            self.state = SlotStateCache(linear_specs, num_slots=num_slots, dtype=self.dtype, device=self.device)
        self.kv_shared = int(getattr(text_config, "num_kv_shared_layers", 0) or 0) > 0
        params = inspect.signature(model.forward).parameters
        # transformers 5.24 renamed `past_key_values` to `cache`; 5.17 silently swallows `cache=`.
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.fused_pointwise = fused_pointwise  # use the compiled twins (engine.fusion) in forwards
        # CPU: linear layers as `W @ x.T` inside the runner's forwards (see engine.cpu_linear).
        self.cpu_linears = (
            cpu_linear.plain_linears(model) if cpu_linear.applies_to(model) and cpu_linear.enabled() else []
        )
        self.forwards = 0
        self.eager_forwards = 0
        # Records the forwards and cache operations for replay at another model size (engine.schedule).
        self.recorder: ScheduleRecorder | None = None
        self._shape_labels: dict[tuple[int, int, int], str] = {}  # static shape -> label, made once
        self._eager_key_length_used = 0  # the last eager forward's key length (its label)
        # Linear-attention models: static verify forwards keep their per-position states in the
        # state cache's snapshot buffers, sized for verify chunks of up to this many tokens (None:
        # the largest token bucket); a wider verify forward runs eagerly.
        self.state_snapshot_tokens = state_snapshot_tokens
        # Why a model runs without static forwards although they were asked for (None: it does not).
        self.static_fallback: str | None = None
        if capture_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; use static_shapes alone to test the static path on CPU")
        self.static: StaticForwardPool | None = None
        if static_shapes is not None or capture_graphs:
            self.static = StaticForwardPool(self, static_shapes or GraphBuckets(), capture=capture_graphs)
        # Static forwards read the slot cache in place with the Triton kernel (engine.slot_attention)
        # when asked and possible (Triton present, SDPA model, power-of-two head size). Not with
        # shared K/V: the layers that reuse a K/V read it from the model's `shared_kv_states`, which
        # would then hold whole cache buffers instead of the rows' keys.
        self.slot_attention = bool(
            slot_attention and self.static is not None and not self.kv_shared and slot_attention_glue.use_for(model)
        )
        # Greedy decode steps launched before the previous one's tokens are read (`engine.decode_ahead`):
        # static forwards only.
        self.ahead = (
            DecodeAhead(self.static, stateful=self.state is not None)
            if decode_ahead and self.static is not None
            else None
        )
        # Whether the last `run` took a forward launched during the step before (its wait is not its cost).
        self.overlapped = False

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def run(
        self, chunks: list[Chunk], want_logits: list[bool] | None = None, look_ahead: bool = False
    ) -> ForwardResult:
        """Run every chunk; return per chunk its logits, greedy tokens and forward shape.

        `want_logits[i] = False` skips copying chunk i's logits out (greedy rows need only
        the argmax): one kernel launch and allocation less per row and step. `look_ahead`: the
        caller expects the same rows to decode one position further next (`engine.decode_ahead`),
        so that forward is launched before this one's tokens are read.
        """
        for c in chunks:
            end = c.start + len(c.token_ids)
            if not c.token_ids:
                raise ValueError("empty chunk")
            if end > self.max_len:
                raise ValueError(f"chunk ends at position {end}, beyond the cache length {self.max_len}")
        self.overlapped = False
        if self.ahead is not None and (look_ahead or self.ahead.pending is not None):
            ahead = self._run_ahead(chunks, want_logits, look_ahead)
            if ahead is not None:
                return ahead
        out = ForwardResult([None] * len(chunks), [None] * len(chunks), [""] * len(chunks))
        recorder = self.recorder
        started = time.perf_counter() if recorder is not None else 0.0
        with self._forward_scope():
            self._run_groups(chunks, out, want_logits)
        if recorder is not None:  # the greedy tokens' host copy has synchronised the device
            recorder.forward(chunks, want_logits, started, time.perf_counter())
        return out

    def _forward_scope(self) -> contextlib.ExitStack:
        """What every forward runs under: the compiled pointwise twins, the CPU's linears."""
        scope = contextlib.ExitStack()
        if self.fused_pointwise:
            scope.enter_context(fused())
        if self.cpu_linears:
            scope.enter_context(cpu_linear.weight_major_linears(self.cpu_linears))
        return scope

    def _run_ahead(self, chunks: list[Chunk], want_logits: list[bool] | None, look_ahead: bool) -> ForwardResult | None:
        """A decode step through `self.ahead`: the pending successor's result for the rows it ran
        exactly (the others, e.g. a request admitted this step, in a forward of their own), else
        (when `look_ahead` and the step fits) one launched now; with `look_ahead` the next
        successor goes out before the tokens are read. None: run as usual."""
        ahead = self.ahead
        flight, taken = ahead.take(chunks, want_logits)
        self.overlapped = flight is not None
        if flight is None:
            shape = ahead.shape_for(chunks) if look_ahead and want_logits and not any(want_logits) else None
            if shape is None:
                return None
            with self._forward_scope():
                flight = ahead.launch(chunks, shape)
            taken = list(range(len(chunks)))
        elif self.state is not None:  # what `settle` reads, as a static forward of these rows would note
            rows = [chunks[i] for i in taken]
            self.state.note_static_rows([c.slot for c in rows], [c.start for c in rows], [1] * len(rows), 1, False)
        self.forwards += 1
        rest = sorted(set(range(len(chunks))) - set(taken))
        if look_ahead and not rest:
            with self._forward_scope():
                # Every row taken (the usual step): no per-row list to build and match again.
                kept = None if len(taken) == len(flight.slots) else [chunks[i].slot for i in taken]
                ahead.launch_successor(flight, kept)
        tokens = dict(zip(flight.slots, ahead.tokens(flight)))
        label = self._shape_labels.get(flight.shape)
        if label is None:
            label = self._shape_labels[flight.shape] = f"{flight.shape[0]}x1/k{flight.shape[2]}"
        out = ForwardResult([None] * len(chunks), [None] * len(chunks), [""] * len(chunks))
        for i in taken:
            out.argmax[i], out.shapes[i] = [tokens[chunks[i].slot]], label
        if rest:
            others = ForwardResult([None] * len(rest), [None] * len(rest), [""] * len(rest))
            with self._forward_scope():
                self._run_groups(
                    [chunks[i] for i in rest], others, None if want_logits is None else [want_logits[i] for i in rest]
                )
            for j, i in enumerate(rest):
                out.logits[i], out.argmax[i], out.shapes[i] = others.logits[j], others.argmax[j], others.shapes[j]
        return out

    def _run_groups(self, given: list[Chunk], out: ForwardResult, want_logits: list[bool] | None) -> None:
        chunks, origin, groups = self._group(given)
        for group in groups:
            group_chunks = [chunks[i] for i in group]
            shape = self.static.shape_for(group_chunks) if self.static is not None else None
            if shape is not None:
                logits, top = self.static.run(group_chunks, shape)
                label = self._shape_labels.get(shape)
                if label is None:
                    label = self._shape_labels[shape] = f"{shape[0]}x{shape[1]}/k{shape[2]}"
            else:
                logits = self._forward(group_chunks)
                top = logits.argmax(dim=-1)
                self.eager_forwards += 1
                label = f"eager {logits.shape[0]}x{max(len(c.token_ids) for c in group_chunks)}/k{self._eager_key_length_used}"
            for i in group:
                out.shapes[origin[i]] = label  # a split prompt piece: its last part's (the logits')
            self.forwards += 1
            width = logits.shape[1]
            # One device-to-host copy per forward: the greedy tokens of every row. It also
            # orders this forward before the next one reuses the static output buffers.
            # One conversion to Python lists for the group: row by row costs ~3.5 us a row.
            top_host = top[: len(group)].cpu().tolist()
            for row, i in enumerate(group):
                n = chunks[i].num_logits
                if n > 0:
                    k = origin[i]
                    if want_logits is None or want_logits[k]:
                        # A copy: static forwards share their output buffer across steps.
                        out.logits[k] = logits[row, width - n :].to(torch.float32, copy=True)
                    out.argmax[k] = top_host[row][width - n :]

    def warm_up_graphs(
        self, batch_sizes: list[int], token_counts: list[int], max_cached: int, progress=None, verify: bool = True
    ) -> float:
        """Build the static forwards for these shapes (every key bucket up to `max_cached`; for
        linear-attention models also their verify variants unless `verify` is False).

        Returns the seconds spent (capture and compile), which callers report and keep out
        of their measurements.
        """
        if self.static is None:
            return 0.0
        buckets = self.static.buckets
        largest = buckets.key_bucket(max_cached, self.max_len)
        keys = [k for k in buckets.key_buckets(self.max_len) if k <= largest]
        shapes = [
            (b, t, k)
            for b in sorted({buckets.batch_bucket(x) for x in batch_sizes} - {None})
            for t in sorted({buckets.token_bucket(x) for x in token_counts} - {None})
            for k in keys
        ]
        return self.static.warm_up(shapes, progress, verify=verify)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.copy_slot(src, dst, length)
        if self.state is not None:
            self.state.copy_slot(src, dst)
        if self.recorder is not None:
            self.recorder.copy(src, dst, length)

    @property
    def stateful(self) -> bool:
        """Whether the model has linear-attention layers (a state that cannot be truncated)."""
        return self.state is not None

    def settle(self, slot: int, position: int) -> bool:
        """Put `slot`'s linear-attention state at `position` (cached tokens after a verify or a
        truncation). True when the slot is there (always for models without such layers); False
        when the position lies before the last forward's chunk: the caller must then recompute the
        context from position 0."""
        if self.recorder is not None:
            self.recorder.settle(slot, position)
        if self.state is None:
            return True
        return self.state.settle(slot, position)

    def release_slot(self, slot: int) -> None:
        """The slot's sequence is gone: drop what was kept to roll its state back."""
        if self.recorder is not None:
            self.recorder.free(slot)
        if self.state is not None:
            self.state.forget(slot)

    # ------------------------------------------------------------------ internals
    def _group(self, chunks: list[Chunk]) -> tuple[list[Chunk], list[int], list[list[int]]]:
        """Split chunks into forwards so that padding stays bounded.

        One forward per step is best when steps are launch-bound (GPU); on a CPU the padded
        tokens cost real compute. Greedy: longest first, add while padded/real stays under
        `max_padding_ratio`.

        Returns the forwards' chunks (`chunks`, then the parts of any prompt piece split at the
        token buckets, `_prompt_groups`), for each the index in `chunks` of the chunk it belongs
        to, and the groups (indices into the forwards' chunks) in the order they run.
        """
        origin = list(range(len(chunks)))
        if self.static is None:
            return chunks, origin, self._sorted(chunks, self._group_by_padding(chunks, origin))
        # Static forwards: short chunks go together up to the largest batch bucket (a replay
        # costs about the same whatever it carries); long prefill pieces run eagerly. Prompt
        # pieces that the padding budget would split into several replays (each a full weight
        # read) get replays of their own (`_prompt_groups`).
        buckets = self.static.buckets
        max_t = max(buckets.tokens)
        short = [i for i in origin if len(chunks[i].token_ids) <= max_t]
        long = [i for i in origin if len(chunks[i].token_ids) > max_t]
        prompt: list[int] = []
        if buckets.prompt_replay_tokens:
            prompt = [i for i in short if len(chunks[i].token_ids) > 1 and chunks[i].num_logits <= 1]
            if len(self._group_static(chunks, prompt)) > 1:  # one replay holds them: keep it
                moved = set(prompt)
                short = [i for i in short if i not in moved]
            else:
                prompt = []
        parts, prompt_groups = self._prompt_groups(chunks, prompt) if prompt else ([], [])
        forward_chunks = chunks + [part for _, part in parts]
        origin += [piece for piece, _ in parts]
        groups = self._group_static(chunks, short) + prompt_groups + self._group_by_padding(chunks, long)
        return forward_chunks, origin, self._sorted(forward_chunks, groups)

    @staticmethod
    def _sorted(chunks: list[Chunk], groups: list[list[int]]) -> list[list[int]]:
        """Rows in slot order make the cache read a plain slice when slots are contiguous."""
        return [sorted(g, key=lambda i: chunks[i].slot) for g in groups]

    def _prompt_groups(self, chunks: list[Chunk], prompt: list[int]) -> tuple[list[tuple[int, Chunk]], list[list[int]]]:
        """Replays for the prompt pieces `prompt`, by whichever plan pads least.

        Whole: each piece padded to its token bucket, pieces grouped while a replay's padded
        size stays within `GraphBuckets.prompt_replay_tokens`. Split: each piece cut into parts
        (`bucket_parts`: once, 42 tokens = 32 + 10 padded to 16, or fully, 32 + 8 + 2), the k-th
        parts of every piece grouped the same way, one round after another (a part needs the
        cache of the parts before it); only the last part asks for the piece's logits. A replay
        costs about the same up to the limit (the compute knee: below it the weight read
        dominates) and past it about its padded tokens, so a plan's price is the sum over its
        replays of max(padded tokens, limit); a tie keeps the plan with fewer rounds. 32 prompts
        of 42 tokens pad to 2,048 tokens whole and cost 1,536 split; 8 of them cost 512 whole and
        512 cut once. By the fitted H100 step-cost models (`engine/cost_priors`) this choice was
        never the dearer one over 1,953 batches of equal lengths (2-32 rows, 2-64 tokens) and
        1,000 of mixed lengths.

        Returns the split parts as (index in `chunks` of their piece, part), none for the whole
        plan, and the groups: indices into `chunks` followed by the parts.
        """
        buckets = self.static.buckets
        limit = buckets.prompt_replay_tokens

        def price(source: list[Chunk], groups: list[list[int]]) -> int:
            return sum(max(self._padded_tokens([source[i] for i in g]), limit) for g in groups)

        whole = self._group_static(chunks, prompt, limit)
        best = ([], whole, price(chunks, whole))
        for most in (2, None) if buckets.split_prompt_pieces else ():
            parts: list[tuple[int, Chunk]] = []
            rounds: list[list[int]] = []
            for i in prompt:
                c, offset = chunks[i], 0
                for r, size in enumerate(bucket_parts(len(c.token_ids), buckets.tokens, most)):
                    end = offset + size
                    logits = c.num_logits if end == len(c.token_ids) else 0
                    parts.append((i, Chunk(c.slot, c.start + offset, c.token_ids[offset:end], logits)))
                    if r == len(rounds):
                        rounds.append([])
                    rounds[r].append(len(chunks) + len(parts) - 1)
                    offset = end
            source = chunks + [part for _, part in parts]
            split = [g for members in rounds for g in self._group_static(source, members, limit)]
            cost = price(source, split)
            if cost < best[2]:
                best = (parts, split, cost)
        return best[0], best[1]

    def _padded_tokens(self, group: list[Chunk]) -> int:
        buckets = self.static.buckets
        width = max(len(c.token_ids) for c in group)
        return (buckets.batch_bucket(len(group)) or len(group)) * (buckets.token_bucket(width) or width)

    def _group_static(
        self, chunks: list[Chunk], indices: list[int], padded_limit: int | None = None
    ) -> list[list[int]]:
        """Bucketed groups whose padding stays within `static_padding_budget` tokens, or, with
        `padded_limit`, whose padded size does (prompt pieces: `GraphBuckets.prompt_replay_tokens`).

        A replay costs about the same for a few or a few hundred tokens, so decode rows
        share one. But one 64-token verify chunk among 15 decode rows would pad them all to
        64 (1,024 tokens): compute-bound (measured on the H200: ~22 ms per step in fp32
        instead of ~4). A row joins the current group while the padded tokens (batch bucket
        x token bucket) minus the real ones stay within the budget (or all of them within the
        limit); otherwise it starts the next group (one more replay, ~one decode step). A lone
        row always fits.
        """
        assert self.static is not None
        buckets = self.static.buckets
        max_b = max(buckets.batch)

        def full(rows: int, width: int, real: int, n: int) -> bool:
            padded = (buckets.batch_bucket(rows + 1) or max_b + 1) * width
            if padded_limit is not None:
                return rows == max_b or padded > padded_limit
            return rows == max_b or padded - (real + n) > self.static_padding_budget

        return _greedy_groups(chunks, indices, full, lambda n: buckets.token_bucket(n) or n)

    def _group_by_padding(self, chunks: list[Chunk], indices: list[int]) -> list[list[int]]:
        ratio = self.max_padding_ratio
        return _greedy_groups(
            chunks, indices, lambda rows, width, real, n: (rows + 1) * width > ratio * (real + n), lambda n: n
        )

    def _forward(self, chunks: list[Chunk]) -> torch.Tensor:
        device = self.device
        chunk_len = max(len(c.token_ids) for c in chunks)
        batch = len(chunks)
        input_ids = torch.zeros((batch, chunk_len), dtype=torch.long)
        for b, c in enumerate(chunks):
            input_ids[b, chunk_len - len(c.token_ids) :] = torch.tensor(c.token_ids, dtype=torch.long)
        input_ids = input_ids.to(device, non_blocking=True)
        starts = torch.tensor([c.start for c in chunks], device=device)
        lengths = torch.tensor([len(c.token_ids) for c in chunks], device=device)
        positions, _ = query_positions(starts, lengths, chunk_len)
        needed = max(c.start + len(c.token_ids) for c in chunks)
        key_length = min(self.max_len, -(-needed // self.key_length_bucket) * self.key_length_bucket)
        self._eager_key_length_used = key_length
        mask = build_additive_mask(positions, key_length, self.dtype)
        sliding = None
        if self.has_sliding:
            sliding = build_additive_mask(positions, key_length, self.dtype, self.sliding_window)
        attention_mask = self.mask_mapping(mask, sliding)
        self.cache.prepare_step(
            slots=[c.slot for c in chunks],
            starts=[c.start for c in chunks],
            lengths=[len(c.token_ids) for c in chunks],
            chunk_len=chunk_len,
            key_length=key_length,
        )
        if self.state is not None:
            self.state.prepare_step(
                [c.slot for c in chunks],
                [c.start for c in chunks],
                [len(c.token_ids) for c in chunks],
                chunk_len,
                snapshots=any(c.num_logits > 1 for c in chunks),
            )
        num_logits = max(1, max(c.num_logits for c in chunks))
        return self.call_model(input_ids, attention_mask, positions, num_logits)

    def mask_mapping(self, mask: torch.Tensor, sliding: torch.Tensor | None):
        """The attention mask as the model takes it: one tensor, or a dict per layer type when the
        model has several (linear-attention layers take none: their padding is the state cache's)."""
        if len(self.layer_types) == 1 and sliding is None:
            return mask
        by_type = {"full_attention": mask, "sliding_attention": sliding if sliding is not None else mask}
        by_type["linear_attention"] = None
        return {t: by_type.get(t, mask) for t in {*self.layer_types, "full_attention"}}

    def call_model(
        self, input_ids: torch.Tensor, attention_mask, positions: torch.Tensor, logits_to_keep: int
    ) -> torch.Tensor:
        """The model over a routed step (the caches' routing is set); clears the routing after."""
        try:
            with linear_attention.running(self.state):
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=logits_to_keep,
                    **{self.cache_kwarg: self.cache},
                )
        finally:
            self.cache.end_step()
            if self.state is not None:
                self.state.end_step()
        return out.logits


def bucket_parts(length: int, token_buckets: tuple[int, ...], most: int | None = None) -> list[int]:
    """`length` tokens as parts of the largest bucket that fits, largest first (42 over 1, 2, 4,
    ..., 64: [32, 8, 2]), at most `most` of them (the last takes the rest: [32, 10] for 2); a
    remainder below the smallest bucket is a part of its own (padded up to it)."""
    parts: list[int] = []
    while length:
        last = most is not None and len(parts) == most - 1
        size = length if last else max((b for b in token_buckets if b <= length), default=length)
        parts.append(size)
        length -= size
    return parts


def _greedy_groups(
    chunks: list[Chunk],
    indices: list[int],
    full: Callable[[int, int, int, int], bool],
    width_of: Callable[[int], int],
) -> list[list[int]]:
    """Longest chunk first; a chunk joins the current group unless `full(rows, width, real
    tokens, its length)` says the group should close (the width is `width_of` the group's
    longest chunk)."""
    order = sorted(indices, key=lambda i: len(chunks[i].token_ids), reverse=True)
    groups: list[list[int]] = []
    current: list[int] = []
    width = real = 0
    for i in order:
        n = len(chunks[i].token_ids)
        if current and full(len(current), width, real, n):
            groups.append(current)
            current, real = [], 0
        if not current:
            width = width_of(n)
        current.append(i)
        real += n
    if current:
        groups.append(current)
    return groups
