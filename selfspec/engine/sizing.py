"""Engine sizing from the model and the device: context length, slots that fit, end-of-text ids."""

from __future__ import annotations

import torch

from selfspec.engine.kv_cache import SlotKVCache
from selfspec.engine.linear_attention import is_gated_deltanet, layer_spec
from selfspec.engine.state_cache import SlotStateCache


def slots_from_free_memory(
    model, max_len: int, device: torch.device, fraction: float, cap: int = 256, snapshot_tokens: int = 0
) -> int:
    """How many KV slots of `max_len` fit in `fraction` of the device's free memory (with a
    linear-attention model's state and, for static verify forwards of up to `snapshot_tokens`
    tokens, its snapshot buffers)."""
    dtype = next(model.parameters()).dtype
    per_slot = SlotKVCache.bytes_per_slot(model.config, max_len, dtype)
    linear = {int(m.layer_idx): layer_spec(m) for m in model.modules() if is_gated_deltanet(m)}
    per_slot += SlotStateCache.bytes_per_slot(linear, dtype)
    per_slot += SlotStateCache.snapshot_bytes_per_slot(linear, dtype, snapshot_tokens)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = _available_host_memory()
    slots = int(free * fraction // per_slot) - 1  # one slot's worth stays for the scratch row
    if slots < 1:
        raise ValueError(
            f"not even one KV slot of {max_len} positions ({per_slot / 2**20:.0f} MiB) fits in {fraction:.0%} "
            f"of free memory ({free / 2**20:.0f} MiB); lower max_len"
        )
    return min(slots, cap)


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


def model_context_length(config) -> int:
    """The model's positions (max_position_embeddings; 4096 when the config names none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "max_position_embeddings", None) or 4096)


def eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(t) for t in source)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
