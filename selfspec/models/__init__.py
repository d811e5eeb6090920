"""Model loading (packaged defaults, GGUF, local dirs, hub ids) and thinking markers."""

from selfspec.models.loader import (
    LoadedModel,
    ModelInfo,
    list_local_models,
    load_model,
    parse_dtype,
    resolve_cache_dir,
    resolve_device,
)
from selfspec.models.registry import (
    MissingModelPackageError,
    ModelEntry,
    ModelNotFoundError,
    known_model_names,
    register_model,
    unregister_model,
)
from selfspec.models.tokenizer_check import TokenizerDefectError
from selfspec.thinking.format import (
    EndOfThinkingMatcher,
    ThinkingFormat,
    build_prompt_ids,
    build_prompt_text,
    generation_starts_in_thinking,
    split_reasoning,
)

__all__ = [
    "EndOfThinkingMatcher",
    "LoadedModel",
    "MissingModelPackageError",
    "ModelEntry",
    "ModelInfo",
    "ModelNotFoundError",
    "ThinkingFormat",
    "TokenizerDefectError",
    "build_prompt_ids",
    "build_prompt_text",
    "generation_starts_in_thinking",
    "known_model_names",
    "list_local_models",
    "load_model",
    "parse_dtype",
    "register_model",
    "resolve_cache_dir",
    "resolve_device",
    "split_reasoning",
    "unregister_model",
]
