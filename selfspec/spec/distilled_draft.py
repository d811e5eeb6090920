"""Loading a distilled shallow self-draft: the target's first N layers (copied) + a merged LoRA.

The draft directory (written by the research part's distillation) holds peft's adapter files and a
`selfspec_draft.json` manifest: base spec, N, the target's shape and a weight signature of its first
N layers. Loading checks all three before it merges, because a LoRA trained on other weights
silently drafts garbage (acceptance near zero) instead of failing. The target is never modified:
the draft runs on deep copies of the layers; the embedding, final norm and head stay shared.
Shipped drafts live in the `selfspec_weights` data package (`distilled:<name>`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from selfspec.engine.fusion import compile_pointwise_modules, unfused_copy
from selfspec.models.registry import PACKAGED_DRAFTS_DIR
from selfspec.spec.draft_model import shallow_draft

FORMAT = "selfspec-distilled-draft"
VERSION = 1
MANIFEST = "selfspec_draft.json"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
DISTILLED_PREFIX = "distilled:"
SIGNATURE_RTOL = 1e-2


def own_layers_draft(target: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """`shallow_draft(target, num_layers)` with deep copies of the layers (embedding, final
    norm and head still shared with the target). Training or merging a LoRA into the draft
    then cannot change the target."""
    draft = shallow_draft(target, num_layers)
    draft.model.layers = unfused_copy(draft.model.layers)
    return draft


def _is_fused(model: torch.nn.Module) -> bool:
    return any(getattr(m.__dict__.get("forward"), "_selfspec_fused", False) for m in model.modules())


def layer_signature(model: torch.nn.Module, num_layers: int, *, seed: int = 0) -> list[list[float]]:
    """Per layer i < num_layers: [||θ_i||, <θ_i, r_i>] with r_i seeded Gaussian, plus the same
    for the embedding and the final norm (first rows). Robust to dtype casts (relative error
    ~1e-3 in bf16), but a different checkpoint (e.g. the base without the thinker's merged
    LoRA) moves the projections by ~||Δθ||."""
    inner = model.model
    parts: list[torch.nn.Module] = list(inner.layers)[:num_layers] + [inner.get_input_embeddings(), inner.norm]
    generator = torch.Generator().manual_seed(seed)
    signature = []
    for part in parts:
        norm_sq, projection = 0.0, 0.0
        for _, param in sorted(part.named_parameters(), key=lambda kv: kv[0]):
            values = param.detach().float().flatten().cpu()
            r = torch.randn(values.numel(), generator=generator)
            norm_sq += float(values.double().pow(2).sum())
            projection += float((values.double() * r.double()).sum())
        signature.append([math.sqrt(norm_sq), projection])
    return signature


def signature_mismatch(
    recorded: Sequence[Sequence[float]], actual: Sequence[Sequence[float]], rtol: float = SIGNATURE_RTOL
) -> str | None:
    """None when the signatures agree (relative to each part's norm), else what differs."""
    if len(recorded) != len(actual):
        return f"{len(recorded)} recorded parts vs {len(actual)}"
    for index, ((norm_a, proj_a), (norm_b, proj_b)) in enumerate(zip(recorded, actual)):
        scale = max(norm_a, norm_b, 1e-12)
        if abs(norm_a - norm_b) > rtol * scale or abs(proj_a - proj_b) > rtol * scale:
            return f"part {index}: norm {norm_a:.6g} vs {norm_b:.6g}, projection {proj_a:.6g} vs {proj_b:.6g}"
    return None


def _model_shape(model: torch.nn.Module) -> dict[str, Any]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {
        "target_layers": len(model.model.layers),
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "model_type": getattr(config, "model_type", None),
    }


def read_draft_manifest(path: str | Path) -> dict[str, Any]:
    directory = Path(path).expanduser()
    manifest_file = directory / MANIFEST
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{directory} is not a distilled draft (no {MANIFEST})")
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("format") != FORMAT or int(manifest.get("version", 0)) > VERSION:
        raise ValueError(
            f"{manifest_file}: unsupported format {manifest.get('format')!r} version {manifest.get('version')}"
        )
    for name in (ADAPTER_CONFIG_FILE, ADAPTER_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}")
    return manifest


def resolve_draft_dir(path: str) -> Path:
    """A draft directory as given, else the packaged draft of that name."""
    given = Path(path).expanduser()
    packaged = PACKAGED_DRAFTS_DIR / path
    if not given.exists() and "/" not in path and packaged.is_dir():
        return packaged
    return given


def parse_distilled_spec(spec: str) -> tuple[Path, int | None] | None:
    """`"distilled:<dir or packaged name>"` -> (dir, None); `"layers:N+<dir>"` -> (dir, N);
    anything else (including plain `"layers:N"`) -> None."""
    if spec.startswith(DISTILLED_PREFIX):
        path = spec[len(DISTILLED_PREFIX) :]
        if not path:
            raise ValueError("draft 'distilled:' needs a directory: distilled:<dir>")
        return resolve_draft_dir(path), None
    if spec.startswith("layers:") and "+" in spec:
        count, _, path = spec[len("layers:") :].partition("+")
        try:
            layers = int(count)
        except ValueError:
            raise ValueError(f"draft {spec!r}: expected layers:N+<dir>") from None
        if not path:
            raise ValueError(f"draft {spec!r}: expected layers:N+<dir>")
        return resolve_draft_dir(path), layers
    return None


def load_distilled_draft(
    target: torch.nn.Module,
    path: str | Path,
    *,
    layers: int | None = None,
    check_signature: bool = True,
    compile_backend: str = "inductor",
) -> torch.nn.Module:
    """The distilled draft for `target`: its first N layers copied, the LoRA merged into the
    copies, embedding/norm/head shared. The target's weights are not touched. Raises
    ValueError when N (if given), the shape or the target's weight signature differ from
    what the draft was trained on."""
    from peft import PeftModel  # the [lora] extra; imported only when a distilled draft loads

    directory = Path(path).expanduser()
    manifest = read_draft_manifest(directory)
    recorded = int(manifest["layers"])
    if layers is not None and layers != recorded:
        raise ValueError(f"distilled draft {directory} has {recorded} layers, not {layers}")
    shape = _model_shape(target)
    for key in ("hidden_size", "vocab_size", "target_layers"):
        if manifest.get(key) is not None and manifest[key] != shape[key]:
            raise ValueError(
                f"distilled draft {directory} was trained on a target with {key}={manifest[key]}, this one has {shape[key]}"
            )
    if check_signature and manifest.get("signature"):
        problem = signature_mismatch(manifest["signature"], layer_signature(target, recorded))
        if problem is not None:
            raise ValueError(
                f"distilled draft {directory} was trained on other weights than this target's first {recorded} "
                f"layers ({manifest.get('base')!r} recorded; {problem})"
            )
    fused = _is_fused(target)
    draft = own_layers_draft(target, recorded)
    merged = PeftModel.from_pretrained(draft, str(directory), is_trainable=False).merge_and_unload()
    merged.eval()
    merged.requires_grad_(False)
    if fused:
        compile_pointwise_modules(merged, backend=compile_backend)
    return merged


def load_draft_spec(target: torch.nn.Module, spec: str, *, compile_backend: str = "inductor") -> torch.nn.Module:
    """`load_distilled_draft` for a draft spec string (see `parse_distilled_spec`)."""
    parsed = parse_distilled_spec(spec)
    if parsed is None:
        raise ValueError(f"{spec!r} is not a distilled draft spec (distilled:<dir> or layers:N+<dir>)")
    path, layers = parsed
    return load_distilled_draft(target, path, layers=layers, compile_backend=compile_backend)
