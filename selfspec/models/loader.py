"""Load a causal LM + tokenizer from a short name, a GGUF file, a local dir or a hub id.

GGUF files are dequantized by `transformers` on every load (~15 s for SmolLM2-135M on
this CPU), so each is converted once to a safetensors directory under
`<cache_dir>/models/<name>-<key>/` and later loads read that (about a second). The
conversion writes into a temporary directory renamed into place, under a file lock, so
concurrent loaders never see half a model and do the work once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from selfspec.models.gguf import (
    SOURCE_RECORD,
    TRANSFORMERS_LOCK,
    convert_gguf,
    converted_dir,
    ensure_converted,
    file_lock,
    load_gguf,
    load_gguf_tokenizer,
)
from selfspec.models.registry import (
    MissingModelPackageError,
    ModelEntry,
    ModelNotFoundError,
    file_fingerprint,
    get_model_entry,
    known_model_names,
    model_entries,
    packaged_weights_dir,
)
from selfspec.models.tokenizer_check import (
    TokenizerDefectError,
    check_tokenizer,
    defect_message,
    gguf_adds_bos,
    tokenizer_problems,
)
from selfspec.thinking.format import ThinkingFormat

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "SELFSPEC_CACHE_DIR"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_MAX_ADAPTER_DEPTH = 4


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, no grad) and what it came from.

    `source` says where the weights were read from (a GGUF file and its converted cache
    dir, a local dir, a hub id, or base + adapter); `thinking` is the detected
    `ThinkingFormat` (honouring a registry entry's marker overrides).
    """

    model: Any
    tokenizer: Any
    name: str
    source: str
    device: torch.device
    dtype: torch.dtype
    config: Any
    thinking: ThinkingFormat
    load_seconds: float


@dataclass(frozen=True)
class ModelInfo:
    """One row of `selfspec models`: a packaged name or a converted cache dir."""

    name: str
    description: str
    available: bool
    cached: bool
    source: str


def resolve_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Argument, else $SELFSPEC_CACHE_DIR, else ~/.cache/selfspec."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from_env = os.environ.get(CACHE_ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    return Path.home() / ".cache" / "selfspec"


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"unsupported dtype {dtype!r}; allowed: {', '.join(_DTYPES)}")


def resolve_device(device: str | torch.device) -> torch.device:
    """'cpu', 'cuda', 'cuda:N' or 'auto' (CUDA when available)."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"invalid device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'") from error
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} GPU(s) exist")
    return resolved


# --- loading ---------------------------------------------------------------------------------


def _load_hf_model(path_or_id: str, dtype: torch.dtype, attn_implementation: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path_or_id, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
    )


def _load_hf_tokenizer(path_or_id: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path_or_id, local_files_only=True)


def _read_record(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _converted_tokenizer(directory: Path, locate_gguf: Callable[[], Path]) -> Any:
    """The tokenizer of a converted GGUF, checked; rebuilt from the GGUF when the dir has none
    or a wrong one (converted by an older transformers), and saved there once it checks out.

    Raises `TokenizerDefectError` when the installed transformers cannot build it right either.
    """
    record = _read_record(directory)
    expects_bos = record.get("gguf_add_bos_token")
    if (directory / "tokenizer_config.json").is_file():
        tokenizer = _load_hf_tokenizer(str(directory))
        if not tokenizer_problems(tokenizer, expects_bos=expects_bos):
            return tokenizer
    gguf_path = locate_gguf()
    if "gguf_add_bos_token" not in record:
        expects_bos = gguf_adds_bos(gguf_path)
    tokenizer = load_gguf_tokenizer(gguf_path)
    check_tokenizer(tokenizer, origin=str(gguf_path), expects_bos=expects_bos)
    with file_lock(directory.parent.parent / "locks" / f"{directory.name}.lock"):
        for name in TOKENIZER_FILES:
            (directory / name).unlink(missing_ok=True)
        tokenizer.save_pretrained(str(directory))
        record.update(gguf_add_bos_token=expects_bos, tokenizer_problems=[])
        (directory / SOURCE_RECORD).write_text(json.dumps(record, indent=2))
    logger.info("tokenizer of %s rebuilt from %s", directory, gguf_path)
    return tokenizer


def _given_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> Any:
    """A tokenizer directory given in place of the model's own (`--tokenizer`), checked."""
    path = Path(tokenizer_dir).expanduser()
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise ModelNotFoundError(
            f"tokenizer {str(tokenizer_dir)!r}: not a tokenizer directory (no tokenizer.json or tokenizer_config.json)"
        )
    tokenizer = _load_hf_tokenizer(str(path.resolve()))
    check_tokenizer(tokenizer, origin=f"the directory {path}")
    return tokenizer


def _model_tokenizer(resolved: "_Resolved", tokenizer_dir: str | os.PathLike[str] | None) -> Any:
    """The tokenizer to serve `resolved` with: a given directory, a converted GGUF's (checked,
    rebuilt if need be), or the model dir's own (a failed check only warns: its files are the
    model's authors', not a conversion of ours)."""
    if tokenizer_dir is not None:
        return _given_tokenizer(tokenizer_dir)
    if resolved.locate_gguf is not None:
        return _converted_tokenizer(Path(resolved.weights), resolved.locate_gguf)
    tokenizer = _load_hf_tokenizer(resolved.weights)
    problems = tokenizer_problems(tokenizer)
    if problems:
        logger.warning("%s", defect_message(resolved.weights, problems))
    return tokenizer


def _not_found(spec: str) -> ModelNotFoundError:
    hint = ""
    if packaged_weights_dir() is None:
        hint = (
            "; the shipped adapters (smollm2-thinker, ...) come with the selfspec_weights data package, "
            "which is not installed (pip install packages/selfspec-weights from a selfspec checkout)"
        )
    return ModelNotFoundError(
        f"model {spec!r} not found locally; known names: {', '.join(known_model_names())}; "
        "or pass a path to a .gguf file or to a local Hugging Face model directory (with config.json)" + hint
    )


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".gguf") or spec.startswith(("/", "./", "../", "~")) or spec.endswith("/")


@dataclass(frozen=True)
class _Resolved:
    """What `load_model` should read, before dtype/device handling."""

    name: str
    source: str
    weights: str  # a local HF dir or a hub id
    is_hub_id: bool = False
    thinking_start: str | None = None
    thinking_end: str | None = None
    locate_gguf: Callable[[], Path] | None = None
    """For a converted GGUF: where its file is (found only when the tokenizer needs rebuilding)."""


def _resolve_gguf(path: Path, name: str, fingerprint: str, cache_dir: Path) -> _Resolved:
    directory = ensure_converted(path, name, fingerprint, cache_dir)
    return _Resolved(
        name=name, source=f"gguf {path} (converted: {directory})", weights=str(directory), locate_gguf=lambda: path
    )


def _resolve_packaged(entry: ModelEntry, cache_dir: Path) -> _Resolved:
    wheel = entry.gguf
    assert wheel is not None
    wheel.ensure_installed(entry.name)
    fingerprint = wheel.fingerprint()
    target = converted_dir(cache_dir, entry.name, fingerprint)
    if not (target / "config.json").is_file():
        convert_gguf(wheel.locate(cache_dir), target, fingerprint=fingerprint)
    return _Resolved(
        name=entry.name,
        source=f"{entry.source} (converted: {target})",
        weights=str(target),
        thinking_start=entry.thinking_start,
        thinking_end=entry.thinking_end,
        locate_gguf=lambda: wheel.locate(cache_dir),
    )


def _resolve_path_or_id(spec: str, cache_dir: Path) -> _Resolved:
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(f"{spec!r} is a file but not a .gguf file")
        return _resolve_gguf(path.resolve(), path.stem, file_fingerprint(path), cache_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{spec!r} is a directory without config.json, not a Hugging Face model dir")
        return _Resolved(name=path.resolve().name, source=f"local dir {path.resolve()}", weights=str(path.resolve()))
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"model path {spec!r} does not exist")
    return _Resolved(name=spec, source=f"hub id {spec} (local cache)", weights=spec, is_hub_id=True)


def _finish(
    model: Any,
    tokenizer: Any,
    resolved: _Resolved,
    device: torch.device,
    dtype: torch.dtype,
    started: float,
) -> LoadedModel:
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    thinking = ThinkingFormat.detect(tokenizer, resolved.thinking_start, resolved.thinking_end)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=resolved.name,
        source=resolved.source,
        device=device,
        dtype=dtype,
        config=model.config,
        thinking=thinking,
        load_seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class _LoadOptions:
    """What `load_model` was asked for, passed whole down the adapter-on-base recursion."""

    device: torch.device
    dtype: torch.dtype
    cache_dir: Path
    attn: str
    tokenizer_dir: str | os.PathLike[str] | None = None


def _load_adapter_model(entry: ModelEntry, options: _LoadOptions, depth: int) -> LoadedModel:
    """Load `entry.base` in float32 on CPU, merge the LoRA adapter, then cast and move."""
    try:
        from peft import PeftModel  # the [lora] extra, needed only by models that ship as adapters
    except ImportError:
        raise ModelNotFoundError(
            f"model {entry.name!r} ships as a LoRA adapter, which needs peft: pip install 'selfspec[lora]'"
        ) from None

    started = time.perf_counter()
    assert entry.base is not None and entry.adapter_dir is not None
    if not (entry.adapter_dir / "adapter_config.json").is_file():
        raise ModelNotFoundError(f"adapter of {entry.name!r} not found: no adapter_config.json in {entry.adapter_dir}")
    base = _load(entry.base, replace(options, device=torch.device("cpu"), dtype=torch.float32), depth + 1)
    with TRANSFORMERS_LOCK:
        merged = PeftModel.from_pretrained(base.model, str(entry.adapter_dir)).merge_and_unload()
    tokenizer = base.tokenizer
    if options.tokenizer_dir is None and (entry.adapter_dir / "tokenizer_config.json").is_file():
        with TRANSFORMERS_LOCK:
            tokenizer = _load_hf_tokenizer(str(entry.adapter_dir))
        if len(tokenizer) > merged.get_input_embeddings().num_embeddings:
            raise ValueError(
                f"adapter {entry.name!r} ships a tokenizer of {len(tokenizer)} tokens, more than "
                f"the base model's embedding rows ({merged.get_input_embeddings().num_embeddings})"
            )
    resolved = _Resolved(
        name=entry.name,
        source=f"{base.source} + LoRA adapter {entry.adapter_dir}",
        weights=str(entry.adapter_dir),
        thinking_start=entry.thinking_start,
        thinking_end=entry.thinking_end,
    )
    return _finish(merged, tokenizer, resolved, options.device, options.dtype, started)


def _load(spec: str, options: _LoadOptions, depth: int) -> LoadedModel:
    if depth > _MAX_ADAPTER_DEPTH:
        raise ValueError(f"model {spec!r}: adapter bases nest deeper than {_MAX_ADAPTER_DEPTH} (a cycle?)")
    started = time.perf_counter()
    entry = get_model_entry(spec)
    if entry is not None and entry.adapter_dir is not None:
        return _load_adapter_model(entry, options, depth)
    resolved = (
        _resolve_packaged(entry, options.cache_dir)
        if entry is not None
        else _resolve_path_or_id(spec, options.cache_dir)
    )
    tokenizer_dir = options.tokenizer_dir
    try:
        with TRANSFORMERS_LOCK:
            # The tokenizer first: a hub id missing from the local cache fails there at once
            # (the model's loader would ask the network for an adapter config first).
            tokenizer = _model_tokenizer(resolved, tokenizer_dir)
            model = _load_hf_model(resolved.weights, options.dtype, options.attn)
    except TokenizerDefectError:
        raise
    except (OSError, ValueError) as error:
        # Not in the local HF cache, or not even a valid hub id.
        if resolved.is_hub_id:
            raise _not_found(spec) from error
        raise
    if tokenizer_dir is not None:
        resolved = replace(resolved, source=f"{resolved.source}; tokenizer from {Path(tokenizer_dir).expanduser()}")
    return _finish(model, tokenizer, resolved, options.device, options.dtype, started)


def load_model(
    spec: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    cache_dir: str | Path | None = None,
    attn_implementation: str = "sdpa",
    tokenizer: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Load a causal LM for inference.

    `spec`: a packaged short name (`smollm2`, `gemma3-270m`, registered adapters), a
    `.gguf` file (converted once to safetensors in the cache), a local Hugging Face
    directory with config.json, or a hub id already in the local HF cache. Raises
    `ModelNotFoundError` (a ValueError) naming the spec when nothing matches, its
    subclass `MissingModelPackageError` with the pip command when a wheel is missing,
    and ValueError for a bad dtype or device.

    `tokenizer`: a tokenizer directory to use instead of the model's own (vLLM's
    `--tokenizer`). A GGUF's tokenizer is checked (`tokenizer_check`) and, if this
    transformers builds it wrongly, `TokenizerDefectError` says so: running on would feed the
    model prompts cut into pieces it never saw.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(f"model spec must be a non-empty string or path, got {spec!r}")
    resolved_dtype = parse_dtype(dtype)
    resolved_device = resolve_device(device)
    with torch.no_grad():
        options = _LoadOptions(
            resolved_device, resolved_dtype, resolve_cache_dir(cache_dir), attn_implementation, tokenizer
        )
        return _load(spec.strip(), options, 0)


# --- listing -----------------------------------------------------------------------------------


def _entry_info(entry: ModelEntry, cache_dir: Path, depth: int = 0) -> ModelInfo:
    if entry.gguf is not None:
        available = not entry.gguf.missing_distributions()
        if available:
            try:
                cached = (converted_dir(cache_dir, entry.name, entry.gguf.fingerprint()) / "config.json").is_file()
            except (ModelNotFoundError, OSError):
                available, cached = False, False
        else:
            cached = False
        return ModelInfo(entry.name, entry.description, available, cached, entry.source)
    base_entry = get_model_entry(entry.base or "")
    adapter_ok = entry.adapter_dir is not None and (entry.adapter_dir / "adapter_config.json").is_file()
    if base_entry is not None and depth < _MAX_ADAPTER_DEPTH:
        base_info = _entry_info(base_entry, cache_dir, depth + 1)
        available, cached = base_info.available and adapter_ok, base_info.cached and adapter_ok
    else:
        base_path = Path(entry.base or "").expanduser()
        available = adapter_ok and base_path.exists()
        cached = available
    return ModelInfo(entry.name, entry.description, available, cached, entry.source)


def list_local_models(cache_dir: str | Path | None = None) -> list[ModelInfo]:
    """Packaged names (installed? converted?) and any other converted GGUF in the cache."""
    root = resolve_cache_dir(cache_dir)
    infos = [_entry_info(entry, root) for entry in model_entries()]
    listed_dirs = set()
    for entry in model_entries():
        if entry.gguf is not None and not entry.gguf.missing_distributions():
            with contextlib.suppress(ModelNotFoundError, OSError):
                listed_dirs.add(converted_dir(root, entry.name, entry.gguf.fingerprint()).name)
    models_dir = root / "models"
    if models_dir.is_dir():
        for directory in sorted(models_dir.iterdir()):
            if directory.name in listed_dirs or not (directory / "config.json").is_file():
                continue
            record_path = directory / SOURCE_RECORD
            source = str(directory)
            if record_path.is_file():
                with contextlib.suppress(ValueError, OSError):
                    source = json.loads(record_path.read_text()).get("gguf_file", source)
            infos.append(ModelInfo(str(directory), "converted GGUF in the cache", True, True, source))
    return infos


__all__ = [
    "CACHE_ENV_VAR",
    "LoadedModel",
    "MissingModelPackageError",
    "ModelInfo",
    "ModelNotFoundError",
    "convert_gguf",
    "converted_dir",
    "list_local_models",
    "load_gguf",
    "load_model",
    "parse_dtype",
    "resolve_cache_dir",
    "resolve_device",
]
