"""`EngineConfig`: sizing and batching knobs of one engine, validated before anything loads."""

from __future__ import annotations

from dataclasses import dataclass, field

from selfspec.engine.static_forward import GraphBuckets


@dataclass
class EngineConfig:
    """Sizing and batching knobs. Defaults suit a small model on a CPU."""

    num_slots: int = 8  # 0: as many as `memory_fraction` of free memory holds (at most 256)
    memory_fraction: float = 0.5
    max_len: int | None = None  # None: min(model context, 4096)
    clamp_max_len: bool = False  # a max_len beyond the model's context is cut to it (else an error)
    prefill_chunk: int = 512
    max_prefill_tokens_per_step: int = 1024
    max_padding_ratio: float | None = None  # None: 1.5 on CPU (padding costs compute), 16 on GPU
    key_length_bucket: int = 32
    # Long drafts are verified in chunks of this many proposals (static forwards: at most the
    # largest token bucket less the pending token, so a verify chunk never runs eagerly).
    max_proposal_tokens: int = 64
    # Under load: at most this many tokens fed per forward across the batch, each row's proposal
    # cut to an equal share of what the pending tokens leave (None: no limit). A batch-1 verify of
    # 16 tokens costs about a decode step; sixteen rows of 16 make a forward compute-bound, where
    # speculation that helps one request alone slows the whole batch. Outputs are unchanged.
    max_step_tokens: int | None = None
    # CUDA graphs for decode/verify steps (None: on when the model is on a CUDA device).
    cuda_graphs: bool | None = None
    # Static-shape forwards without capture: the graph path's bucketing on any device (tests).
    static_shapes: bool = False
    graph_buckets: GraphBuckets = field(default_factory=GraphBuckets)
    # torch.compile the pointwise pieces (norms, MLP activation, rotary) before capture
    # (None: on with CUDA graphs). Fewer, fused kernels per step.
    compile_pointwise: bool | None = None
    # Read the slot cache in place with a Triton kernel in static forwards (None: with CUDA graphs).
    slot_attention: bool | None = None
    # Skinny GEMMs (engine.skinny_gemm) for decode/verify steps where measured faster than
    # cuBLAS, per weight shape (None: with compiled pointwise pieces on a CUDA device).
    skinny_gemms: bool | None = None
    compile_backend: str = "inductor"  # "aot_eager" checks the fused path without a compiler (tests)
    # Static forwards: padded-minus-real tokens one replay may carry before rows are split
    # into another replay (a long verify chunk must not pad every decode row to its length).
    static_padding_budget: int = 128
    # Plain greedy decode steps launched one ahead of the host (`engine.decode_ahead`; None: with
    # CUDA graphs). Models with linear-attention layers never decode ahead.
    decode_ahead: bool | None = None

    def validate(self) -> None:
        if self.num_slots < 0:
            raise ValueError(f"num_slots must be >= 1 (or 0 for 'from free memory'), got {self.num_slots}")
        if not 0.0 < self.memory_fraction <= 0.95:
            raise ValueError(f"memory_fraction must be in (0, 0.95], got {self.memory_fraction}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if self.prefill_chunk < 1 or self.max_prefill_tokens_per_step < 1:
            raise ValueError("prefill_chunk and max_prefill_tokens_per_step must be >= 1")
        if self.max_proposal_tokens < 1:
            raise ValueError("max_proposal_tokens must be >= 1")
        if self.max_step_tokens is not None and self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1 (or None), got {self.max_step_tokens}")
        if self.static_padding_budget < 0:
            raise ValueError(f"static_padding_budget must be >= 0, got {self.static_padding_budget}")
