"""Model shapes for timing runs: random weights of a real model's config.

Why: a forward's time depends on the model's shapes, never on its weights' values, so speed
measurements (`benchmarks/step_profile.py`, `benchmarks/engine_speed.py`, `selfspec bench replay`)
build a random-weight model of the served model's published config instead of carrying its files
to the GPU machine.
"""

from __future__ import annotations

import torch

SHAPES = {
    "smollm2": dict(
        family="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
    ),
    "gemma3-270m": dict(
        family="gemma3",
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        sliding_window=512,
        query_pre_attn_scalar=256,
    ),
    # The reasoning models users serve (published configs; random weights of these shapes).
    "qwen3-4b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    "qwen3-8b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    # DeepSeek-R1-Distill-Qwen-7B.
    "qwen2-7b": dict(
        family="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    ),
    # Qwen3.5-4B's text model, from its published config as recalled (not read from the hub):
    # Gated DeltaNet layers with a full-attention layer every 4th (8 of 32), gated attention with
    # partial rotary. Least sure: hidden/intermediate sizes and the linear-attention head counts.
    "qwen3.5-4b": dict(
        family="qwen3_5",
        vocab_size=248320,
        hidden_size=2560,
        intermediate_size=9216,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        full_attention_interval=4,
        tie_word_embeddings=True,
        max_position_embeddings=262144,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    ),
    # Gemma-4-E4B's text model, as recalled: 42 layers (sliding:full 5:1, window 512), full
    # layers with head dim 512, the last 18 layers reuse earlier K/V, 256-wide per-layer inputs.
    # Least sure: the layer and shared-layer counts, intermediate size and kv heads.
    "gemma4-e4b": dict(
        family="gemma4",
        vocab_size=262144,
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=42,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        global_head_dim=512,
        sliding_window=512,
        num_kv_shared_layers=18,
        hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
}


def shaped_config(name: str):
    """The transformers config of shape `name` (also what vLLM's dummy-weight runs load)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    spec = dict(SHAPES[name])
    family = spec.pop("family")
    if family == "gemma3":
        n = spec["num_hidden_layers"]
        spec["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
        config = Gemma3TextConfig(**spec)
    elif family == "qwen3":
        config = Qwen3Config(**spec)
    elif family == "qwen2":
        config = Qwen2Config(**spec)
    elif family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        config = Qwen3_5TextConfig(**spec)
    elif family == "gemma4":
        from transformers import Gemma4TextConfig

        config = Gemma4TextConfig(**spec)  # default layer types: every 6th layer full
    else:
        config = LlamaConfig(**spec)
    return config


def shaped_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    config = shaped_config(name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval().requires_grad_(False)
