"""The arbitrator's backbone with its LoRA adapters folded into the projection weights.

Why: at inference the adapters only add work. Each adapted projection runs three more
matmuls (dropout is the identity in eval mode, then A, then B, then a scaled add), which on a
GPU means ~12 more kernels per layer on the critical path of every decision and on a CPU
roughly a third of a cached decision's time (measured: peft's wrapper and the rank-16
matmuls). `W + scale * B @ A` computes the same projection in one matmul.

The folded copy must follow the adapters: RL updates them in place between rollouts, and a
checkpoint load writes them in place too. So `refresh()` compares the version counters of
the adapters' tensors (every in-place write bumps one) with those of the last fold and folds
again into the *same* weight tensors, which keeps CUDA graphs that read them valid. The fold
is computed in float32 and rounded once to the weights' dtype.
"""

from __future__ import annotations

import torch

from selfspec.engine.fusion import unfused_copy


def _lora_modules(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer  # the [lora] extra: imported on use

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


class MergedBackbone:
    """A plain (adapter-free) copy of a LoRA-adapted backbone, kept equal to it by `refresh`."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.source = backbone
        self.adapted = _lora_modules(backbone)
        if not self.adapted:
            raise ValueError("the backbone has no LoRA layers to merge")
        self.module = unfused_copy(backbone)
        self.merged: dict[str, torch.nn.Linear] = {}
        for name, layer in _lora_modules(self.module).items():
            base = layer.get_base_layer()
            if not isinstance(base, torch.nn.Linear):
                raise TypeError(f"only LoRA on linear layers merges; {name} adapts a {type(base).__name__}")
            parent_name, _, child = name.rpartition(".")
            setattr(self.module.get_submodule(parent_name) if parent_name else self.module, child, base)
            self.merged[name] = base
        self.module.requires_grad_(False)
        self.module.eval()
        self._versions: tuple[int, ...] | None = None
        self.folds = 0
        self.refresh()

    def _source_versions(self) -> tuple[int, ...] | None:
        """Version counters of the adapters and base weights (any in-place write bumps one);
        None where a tensor keeps none (made under inference mode): then every call folds."""
        try:
            return tuple(p._version for layer in self.adapted.values() for p in layer.parameters())
        except RuntimeError:
            return None

    @torch.no_grad()
    def refresh(self) -> bool:
        """Fold the adapters again if any of their tensors changed since the last fold; True if it did."""
        versions = self._source_versions()
        if versions is not None and versions == self._versions:
            return False
        for name, layer in self.adapted.items():
            base = layer.get_base_layer()
            weight = base.weight.float()
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    weight = weight + layer.get_delta_weight(adapter).float()
            target = self.merged[name]
            target.weight.copy_(weight.to(target.weight.dtype))
            if base.bias is not None:
                target.bias.copy_(base.bias)
        self._versions = versions
        self.folds += 1
        return True


__all__ = ["MergedBackbone"]
