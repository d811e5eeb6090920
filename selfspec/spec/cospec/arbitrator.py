"""CoSpec's arbitrator π(keep draft | prompt, verified prefix, draft block, target tokens).

At a mismatch between the draft and the target, the arbitrator decides whether the draft's
token is kept instead of the target's. It is the draft backbone with LoRA adapters (r 16,
α 32, dropout 0.05, on the attention projections) and a binary head on one "decision"
position; it reads the draft block and the target's verification tokens *together* in one
forward, which is what the hybrid attention mask below makes possible.

Input layout of one state (L = P + D + T + 1 tokens):

    [ prefix: prompt + verified prefix (P) | draft block (D) | target block (T) | decision (1) ]

* prefix   — the committed context plus the draft tokens accepted before the mismatch;
* draft    — the draft's tokens from the mismatch on: d_j .. d_{K-1} (d_j ≠ t_j);
* target   — the target's greedy verification tokens at the same positions, t_j .. t_K
             (t_K is the bonus position, so T = D + 1 when built by the policy);
* decision — one extra query token (the mismatched draft token d_j fed again) whose final
             hidden state feeds the binary head.

The exact mask rule implemented by `hybrid_mask` (True = query i may attend to key j):

* prefix query i (i < P):            j <= i                                  (causal)
* draft query i (P <= i < P+D):      j < P  or  P <= j <= i                  (prefix + own causal past)
* target query i (P+D <= i < P+D+T): j < P  or  P+D <= j <= i                (prefix + own causal past)
* decision query (i = L-1):          every j                                 (sees both blocks)

The draft and target blocks never see each other: they are two alternative continuations
of the same prefix, so both start at position P (`position_ids`: prefix 0..P-1, draft
P..P+D-1, target P..P+T-1, decision P + max(D, T)). Only the decision position compares them.
This is our reading of the paper's "hybrid attention mask" (causal within each stream, the
two streams parallel over a shared prefix, a summary position that attends to everything).

The backbone is a deep copy of the draft's decoder: LoRA is injected by replacing modules,
and a shallow draft (`shallow_draft`) shares its modules with the target, so injecting in
place would change the target model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from selfspec.engine.fusion import unfused_copy


@dataclass(frozen=True)
class ArbitrationState:
    """One mismatch: what π conditions on (token ids only)."""

    prefix: tuple[int, ...]  # prompt + verified prefix (already cut to the arbitrator's window)
    draft_block: tuple[int, ...]  # d_j ..: the first token is the mismatched draft token
    target_block: tuple[int, ...]  # t_j ..: the first token is the target's token at the mismatch

    def __post_init__(self) -> None:
        if not self.prefix or not self.draft_block or not self.target_block:
            raise ValueError("an arbitration state needs a non-empty prefix, draft block and target block")

    @property
    def length(self) -> int:
        return len(self.prefix) + len(self.draft_block) + len(self.target_block) + 1


class LoraSettings(BaseModel):
    """The paper's adapter: r 16, α 32, dropout 0.05."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def hybrid_mask(prefix_len: int, draft_len: int, target_len: int) -> torch.Tensor:
    """The boolean [L, L] mask of the module docstring (True = may attend): one state of
    `hybrid_layout`, the single implementation of the rule."""
    length = prefix_len + draft_len + target_len + 1
    _, allowed, _ = hybrid_layout(torch.tensor([[prefix_len, draft_len, target_len]]), length)
    return allowed[0]


def hybrid_positions(prefix_len: int, draft_len: int, target_len: int) -> torch.Tensor:
    """Position ids [L]: both blocks continue the prefix from position P (`hybrid_layout`)."""
    length = prefix_len + draft_len + target_len + 1
    positions, _, _ = hybrid_layout(torch.tensor([[prefix_len, draft_len, target_len]]), length)
    return positions[0]


@dataclass
class ArbitratorBatch:
    """Right-padded model inputs for a list of states."""

    input_ids: torch.Tensor  # [B, L]
    position_ids: torch.Tensor  # [B, L]
    allowed: torch.Tensor  # [B, L, L] bool
    decision_index: torch.Tensor  # [B]


def hybrid_layout(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position ids [B, W], the allowed mask [B, W, W] and the decision index [B] of states
    with block lengths `lengths` [B, 3] = (P, D, T), right-padded to `width`.

    The rule of the module docstring, computed with tensor ops on the lengths' device (the
    scalar `hybrid_mask`/`hybrid_positions` are one state of it), so a CUDA graph can build a
    state's layout from three integers (no [W, W] host tensors per decision: on a busy host,
    multi-threaded CPU ops on them took ~110 ms per call on the H200 machine). Padding
    queries see only themselves (finite softmax) and no real query sees a padding key.
    """
    index = torch.arange(width, device=lengths.device).view(1, -1)
    positions = hybrid_index_positions(lengths, index)
    allowed = hybrid_rows(lengths, index, width)
    return positions, allowed, lengths.sum(dim=1)  # the decision is token L - 1 = P + D + T


def hybrid_index_positions(lengths: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Position ids [B, Q] of the state tokens at `index` [1 or B, Q] (0 for padding): both
    blocks continue the prefix from P, the decision sits at P + max(D, T)."""
    p, d, t = (lengths[:, i].view(-1, 1) for i in range(3))  # [B, 1]
    n = p + d + t + 1
    i = index
    return torch.where(
        i < p + d,
        i,
        torch.where(i < p + d + t, i - d, torch.where(i == n - 1, p + torch.maximum(d, t), torch.zeros_like(i))),
    )


def hybrid_rows(lengths: torch.Tensor, queries: torch.Tensor, key_width: int) -> torch.Tensor:
    """The allowed mask [B, Q, key_width] of the state tokens at `queries` [1 or B, Q] over
    keys 0..key_width-1: rows of the module docstring's [L, L] rule, so a forward that has
    the prefix's K/V cached feeds only the rows past it (`prefix_cache`).

    A padding query (index >= L) sees one key, min(index, key_width - 1): its softmax stays
    finite, and no real query sees a key at or past L.
    """
    device = lengths.device
    p, d, t = (lengths[:, i].view(-1, 1, 1) for i in range(3))  # [B, 1, 1]
    n = p + d + t + 1
    q = queries.view(queries.shape[0], -1, 1)  # [B|1, Q, 1]
    k = torch.arange(key_width, device=device).view(1, 1, -1)  # [1, 1, K]
    causal = k <= q
    in_prefix_k = k < p
    draft_k = (k >= p) & (k < p + d)
    target_k = (k >= p + d) & (k < p + d + t)
    allowed = (q < p) & causal
    allowed = allowed | (((q >= p) & (q < p + d)) & (in_prefix_k | (draft_k & causal)))
    allowed = allowed | (((q >= p + d) & (q < p + d + t)) & (in_prefix_k | (target_k & causal)))
    allowed = allowed | ((q == n - 1) & (k < n))
    return allowed | ((q >= n) & (k == torch.clamp(q, max=key_width - 1)))


def state_lengths(states: Sequence[ArbitrationState]) -> torch.Tensor:
    """[B, 3] long: each state's (prefix, draft block, target block) lengths."""
    return torch.tensor([[len(s.prefix), len(s.draft_block), len(s.target_block)] for s in states], dtype=torch.long)


def state_tokens(state: ArbitrationState, width: int | None = None) -> list[int]:
    """The state's input tokens — prefix, draft block, target block, decision (= d_j again) —
    right-padded with 0 to `width` when given."""
    tokens = [*state.prefix, *state.draft_block, *state.target_block, state.draft_block[0]]
    return tokens + [0] * (width - len(tokens)) if width is not None else tokens


def build_batch(
    states: Sequence[ArbitrationState], device: torch.device | str = "cpu", *, width: int | None = None
) -> ArbitratorBatch:
    """Stack states; padding keys are invisible and padding queries see only themselves.

    `width` pads further; it must fit every state. The layout is built on `device`
    (`hybrid_layout`), so only token ids and lengths cross from the host.
    """
    if not states:
        raise ValueError("no states to batch")
    longest = max(s.length for s in states)
    if width is not None and width < longest:
        raise ValueError(f"width {width} is shorter than the longest state ({longest})")
    width = width or longest
    rows = [state_tokens(s, width) for s in states]
    input_ids = torch.tensor(rows, dtype=torch.long).to(device)
    positions, allowed, decision = hybrid_layout(state_lengths(states).to(device), width)
    return ArbitratorBatch(input_ids, positions, allowed, decision)


class Arbitrator(torch.nn.Module):
    """LoRA-adapted draft backbone + a linear binary head on the decision position."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear, config) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.config = config
        self.lora_settings = LoraSettings()
        # What a checkpoint recorded about the draft/target (see `cospec.checkpoint`).
        self.identity: dict = {}
        # Single-state inference on a GPU through CUDA graphs (`arbitrator_graphs`).
        self.use_cuda_graphs = True
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layer_types = getattr(text, "layer_types", None) or []
        window = getattr(text, "sliding_window", None)
        self.sliding_window = window if "sliding_attention" in layer_types else None

    @classmethod
    def from_draft(cls, draft: torch.nn.Module, *, lora: LoraSettings | None = None, seed: int = 0) -> "Arbitrator":
        """A fresh arbitrator on a copy of `draft`'s decoder (LoRA B = 0: starts at the backbone)."""
        from peft import LoraConfig, inject_adapter_in_model  # the [lora] extra: imported on use

        lora = lora or LoraSettings()
        # A fused draft's forwards are closures over the draft's own modules: the copy must run
        # its own (LoRA-wrapped) modules, or an adapter on a fused projection would be bypassed.
        backbone = unfused_copy(draft.model)
        backbone.requires_grad_(False)
        hidden = int(
            draft.config.get_text_config().hidden_size
            if hasattr(draft.config, "get_text_config")
            else draft.config.hidden_size
        )
        dtype = next(backbone.parameters()).dtype
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            config = LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)
            )
            backbone = inject_adapter_in_model(config, backbone)
            head = torch.nn.Linear(hidden, 1, dtype=dtype)
        # Drawn on the CPU (seeded, the same on every device), then moved beside the backbone.
        head = head.to(next(backbone.parameters()).device)
        for name, param in backbone.named_parameters():
            param.requires_grad_("lora_" in name)
        model = cls(backbone, head, draft.config)
        model.lora_settings = lora
        model.eval()
        return model

    def save(self, directory: str | Path, **identity) -> Path:
        """Write the trained part (adapters + head) and its config: `cospec.checkpoint.save_arbitrator`."""
        from selfspec.spec.cospec.checkpoint import save_arbitrator

        return save_arbitrator(self, directory, **identity)

    @classmethod
    def load(cls, directory: str | Path, draft: torch.nn.Module, **identity) -> "Arbitrator":
        """An arbitrator on `draft` from a checkpoint: `cospec.checkpoint.load_arbitrator`."""
        from selfspec.spec.cospec.checkpoint import load_arbitrator

        return load_arbitrator(directory, draft, **identity)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, batch: ArbitratorBatch) -> torch.Tensor:
        """Keep-draft logits [B] (pre-sigmoid; BCE and PPO work on these for stability)."""
        hidden = self.hidden_states(batch)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.head(hidden[rows, batch.decision_index]).squeeze(-1).float()

    def hidden_states(self, batch: ArbitratorBatch) -> torch.Tensor:
        """The backbone's final hidden states [B, L, H] under the hybrid mask."""
        dtype = self.head.weight.dtype
        attention_mask = _additive(batch.allowed, dtype)
        if self.sliding_window is not None:
            distance = batch.position_ids.unsqueeze(-1) - batch.position_ids.unsqueeze(-2)
            windowed = batch.allowed & (distance < self.sliding_window)
            attention_mask = {"full_attention": attention_mask, "sliding_attention": _additive(windowed, dtype)}
        out = self.backbone(
            input_ids=batch.input_ids,
            attention_mask=attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        return out.last_hidden_state  # already through the decoder's final norm

    @torch.inference_mode()
    def keep_logits(self, states: Sequence[ArbitrationState]) -> torch.Tensor:
        """Keep-draft logits [B] float32 on the arbitrator's device (sampled RL decisions use these).

        One state in eval mode on a GPU replays a captured graph (`arbitrator_graphs`): the
        policy asks at nearly every verification round, and eagerly the forward is launch-bound.
        """
        graphs = self.cuda_graphs() if len(states) == 1 and not self.training else None
        logits = graphs.keep_logits(states[0]) if graphs is not None else None
        return logits if logits is not None else self(build_batch(states, self.head.weight.device))

    def cuda_graphs(self):
        """This arbitrator's graph set (`arbitrator_graphs.graphs_for`) on a GPU with graphs on; else None."""
        if not self.use_cuda_graphs or self.head.weight.device.type != "cuda":
            return None
        from selfspec.spec.cospec.graphs import graphs_for

        return graphs_for(self)

    @torch.inference_mode()
    def keep_probability(self, states: Sequence[ArbitrationState]) -> torch.Tensor:
        """π(keep draft) in [0, 1] for each state, [B] float32."""
        return torch.sigmoid(self.keep_logits(states))


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, L, L] additive mask (0 / dtype-min), as the engine builds its own (eager-safe)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)
