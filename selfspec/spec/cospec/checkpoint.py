"""Arbitrator checkpoints: what ships after training, and how it is put back on a draft.

A trained arbitrator is small (LoRA adapters + one linear head); its backbone is the draft
model, which is rebuilt from the target (`layers:N`) or loaded by name. So a checkpoint is
a directory holding only the trained part, in formats other tools read:

    adapter_config.json        peft's LoraConfig (rank, alpha, dropout, target modules)
    adapter_model.safetensors  peft's adapter state dict (keys without the adapter name)
    head.safetensors           the binary head's state dict (weight [1, H], bias [1])
    arbitrator.json            `ArbitratorCheckpoint`: format version, LoRA settings, the
                               draft's identity ("layers:N" or a model name) and shape,
                               the target's name, and free-form training facts

The draft identity and shape are recorded because adapters trained on one backbone load
silently (same parameter names) onto another backbone of the same architecture and then
mean nothing: `load_arbitrator` refuses a draft whose layer count or hidden size differs,
and a caller that knows the draft/target names passes them to have those checked too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from selfspec.spec.cospec.arbitrator import Arbitrator, LoraSettings

if TYPE_CHECKING:
    from selfspec.llm import LLM

FORMAT = "selfspec-arbitrator"
VERSION = 1
CONFIG_FILE = "arbitrator.json"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
HEAD_FILE = "head.safetensors"


class ArbitratorCheckpoint(BaseModel):
    """The JSON side of a checkpoint (`arbitrator.json`)."""

    model_config = ConfigDict(extra="forbid")

    format: str = FORMAT
    version: int = VERSION
    lora: LoraSettings = Field(default_factory=LoraSettings)
    draft: str | None = None  # how the draft is rebuilt: "layers:N" or a model name/path
    target: str | None = None  # the target model's name (the draft's layers come from it)
    draft_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    vocab_size: int | None = None
    model_type: str | None = None
    dtype: str = "float32"
    training: dict[str, Any] = Field(default_factory=dict)  # e.g. {"data_seeds": [0], "steps": ...}


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _draft_shape(draft: torch.nn.Module) -> dict[str, Any]:
    """Layer count, hidden size, vocabulary and family of a draft model."""
    text = _text_config(draft.config)
    output = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
    return {
        "draft_layers": len(draft.model.layers),
        "hidden_size": int(text.hidden_size),
        "vocab_size": None if output is None else int(output.weight.shape[0]),
        "model_type": getattr(text, "model_type", None),
    }


def save_arbitrator(
    arbitrator: Arbitrator,
    path: str | Path,
    *,
    draft: str | None = None,
    target: str | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write `arbitrator`'s adapters, head and config to the directory `path`.

    `draft`/`target` default to the identity the arbitrator was loaded with (so a
    reloaded-and-retrained arbitrator keeps it); pass them when saving a fresh one.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    target_dir = Path(path)
    target_dir.mkdir(parents=True, exist_ok=True)
    known = getattr(arbitrator, "identity", {}) or {}
    lora = arbitrator.lora_settings
    adapter = {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in get_peft_model_state_dict(arbitrator.backbone).items()
    }
    save_file(adapter, str(target_dir / ADAPTER_FILE))
    peft_config = arbitrator.backbone.peft_config["default"]
    peft_config.save_pretrained(str(target_dir))
    head = {name: tensor.detach().cpu().contiguous() for name, tensor in arbitrator.head.state_dict().items()}
    save_file(head, str(target_dir / HEAD_FILE))
    shape = _arbitrator_shape(arbitrator)
    config = ArbitratorCheckpoint(
        lora=lora,
        draft=draft if draft is not None else known.get("draft"),
        target=target if target is not None else known.get("target"),
        dtype=str(arbitrator.head.weight.dtype).removeprefix("torch."),
        training=dict(training if training is not None else known.get("training", {})),
        **shape,
    )
    (target_dir / CONFIG_FILE).write_text(config.model_dump_json(indent=2) + "\n")
    return target_dir


def _arbitrator_shape(arbitrator: Arbitrator) -> dict[str, Any]:
    text = _text_config(arbitrator.config)
    embed = arbitrator.backbone.get_input_embeddings() if hasattr(arbitrator.backbone, "get_input_embeddings") else None
    return {
        "draft_layers": len(arbitrator.backbone.layers),
        "hidden_size": int(text.hidden_size),
        "vocab_size": None if embed is None else int(embed.weight.shape[0]),
        "model_type": getattr(text, "model_type", None),
    }


def read_checkpoint_config(path: str | Path) -> ArbitratorCheckpoint:
    """The checkpoint's `arbitrator.json`, validated (no tensors are read)."""
    source = Path(path)
    config_file = source / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"{source} is not an arbitrator checkpoint (no {CONFIG_FILE})")
    config = ArbitratorCheckpoint.model_validate_json(config_file.read_text())
    if config.format != FORMAT or config.version > VERSION:
        raise ValueError(f"{config_file}: unsupported checkpoint format {config.format!r} version {config.version}")
    return config


def load_arbitrator(
    path: str | Path,
    draft_model: torch.nn.Module,
    *,
    draft: str | None = None,
    target: str | None = None,
) -> Arbitrator:
    """An arbitrator on `draft_model` with the checkpoint's adapters and head.

    Raises ValueError when the draft's shape differs from the one trained on, when the
    given `draft`/`target` names differ from the recorded ones, or when a tensor is
    missing or unexpected. The result sits on the draft's device and dtype, in eval mode.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    source = Path(path)
    config = read_checkpoint_config(source)
    shape = _draft_shape(draft_model)
    for key in ("draft_layers", "hidden_size", "vocab_size"):
        recorded, actual = getattr(config, key), shape[key]
        if recorded is not None and actual is not None and recorded != actual:
            raise ValueError(
                f"arbitrator checkpoint {source} was trained on a draft with {key}={recorded}, this draft has {actual}"
            )
    for key, given in (("draft", draft), ("target", target)):
        recorded = getattr(config, key)
        if given is not None and recorded is not None and given != recorded:
            raise ValueError(f"arbitrator checkpoint {source} was trained with {key} {recorded!r}, not {given!r}")
    arbitrator = Arbitrator.from_draft(draft_model, lora=config.lora)
    device = next(arbitrator.backbone.parameters()).device
    adapter = load_file(str(source / ADAPTER_FILE), device=str(device))
    result = set_peft_model_state_dict(arbitrator.backbone, adapter)
    unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
    missing = [key for key in getattr(result, "missing_keys", []) if "lora_" in key]
    if unexpected or missing:
        raise ValueError(
            f"arbitrator checkpoint {source} does not match this draft: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    head = load_file(str(source / HEAD_FILE), device=str(device))
    arbitrator.head.load_state_dict(head, strict=True)
    arbitrator.identity = {"draft": config.draft, "target": config.target, "training": dict(config.training)}
    arbitrator.eval()
    return arbitrator


def load_arbitrator_for(llm: "LLM", path: str | Path, *, check_target: bool = True) -> Arbitrator:
    """Load a checkpoint for `llm`, attaching the recorded draft first when `llm` has none.

    The target name is checked only when both sides know it (`check_target`), since test
    and wrapped models are named "custom".
    """
    config = read_checkpoint_config(path)
    if getattr(llm, "draft_runner", None) is None:
        if config.draft is None:
            raise ValueError(f"{path}: the checkpoint records no draft; start the LLM with draft='layers:N'")
        llm.set_draft(config.draft)
    draft_name = getattr(llm, "draft_spec", None)
    target_name = getattr(llm, "model_name", None)
    if not check_target or target_name in (None, "custom"):
        target_name = None
    return load_arbitrator(path, llm.draft_runner.model, draft=draft_name, target=target_name)


def describe_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's config as a plain dict (for reports)."""
    return json.loads(read_checkpoint_config(path).model_dump_json())


__all__ = [
    "ArbitratorCheckpoint",
    "describe_checkpoint",
    "load_arbitrator",
    "load_arbitrator_for",
    "read_checkpoint_config",
    "save_arbitrator",
]
