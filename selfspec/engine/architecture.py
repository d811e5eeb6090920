"""What the engine can run, checked once at load: a clear error instead of a traceback mid-forward.

The engine runs decoder layers whose token mixer is either an attention module that writes its
K/V through the cache's `update()` (full or sliding window, K/V shared between layers as in
Gemma-4), or a Gated DeltaNet linear-attention module (Qwen3.5, Qwen3-Next) whose state lives in
`engine.state_cache`. Anything else — Mamba/SSM mixers, short convolutions, chunked attention —
would fail inside a forward (a cache without the layer's state) or silently compute the wrong
mask, so it is refused here, naming the architecture and what is missing.
"""

from __future__ import annotations

import torch

from selfspec.engine.linear_attention import is_gated_deltanet

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")


class UnsupportedArchitectureError(ValueError):
    """The model's architecture has layers the engine cannot run."""


def architecture_name(model: torch.nn.Module) -> str:
    names = getattr(model.config, "architectures", None) or []
    return names[0] if names else type(model).__name__


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The model's decoder layers (the `layers` list of its decoder), or None if not found."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for owner in (decoder, getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    return None


def _is_attention(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx")


def check_architecture(model: torch.nn.Module) -> None:
    """Raise `UnsupportedArchitectureError` unless every decoder layer has a token mixer the
    engine runs and every configured layer type is one it knows."""
    arch = architecture_name(model)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = list(getattr(text, "layer_types", None) or [])
    unknown = sorted(set(types) - set(SUPPORTED_LAYER_TYPES))
    if unknown:
        raise UnsupportedArchitectureError(
            f"{arch} cannot run on the selfspec engine: layer types {unknown} are not supported "
            f"(supported: {', '.join(SUPPORTED_LAYER_TYPES)})"
        )
    layers = decoder_layers(model)
    if layers is None:
        raise UnsupportedArchitectureError(
            f"{arch} cannot run on the selfspec engine: no decoder layer list (`model.layers`) was found"
        )
    for index, layer in enumerate(layers):
        mixers = [m for m in layer.modules() if _is_attention(m) or is_gated_deltanet(m)]
        if mixers:
            continue
        children = ", ".join(sorted({type(m).__name__ for m in layer.children()})) or type(layer).__name__
        if types and types[index] == "linear_attention":
            # transformers labels every recurrent mixer (Mamba, Gated DeltaNet, ...) this way.
            what = (
                f"its linear-attention layer {index} ({children}) is not a Gated DeltaNet with the parameters the "
                "engine's state cache runs (conv1d, A_log, dt_bias, in_proj_qkv/z/b/a or in_proj_qkvz/ba)"
            )
        else:
            what = (
                f"decoder layer {index} has no attention or Gated DeltaNet mixer (its modules: {children}); "
                "recurrent/SSM or convolution mixers have no slot state in the engine"
            )
        raise UnsupportedArchitectureError(f"{arch} cannot run on the selfspec engine: {what}")
