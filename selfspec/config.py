"""The configuration surface: engine knobs and the speculation methods as one pydantic union.

`SpecConfig` is a discriminated union on `method` ("auto", the default policy; "off", plain
decoding; or one fixed method), so a plain dict from a CLI flag, a YAML file
or an HTTP body becomes the right config class, validated, with one error that names the bad
field (`parse_spec({"method": "ssr", "draft_budgets": [200]})`). `LLM.generate(spec=...)`, the
CLI and the server all take these classes.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter

from selfspec.engine.config import EngineConfig
from selfspec.spec.auto import AutoConfig, OffConfig
from selfspec.spec.base import MethodConfig
from selfspec.spec.cospec.policy import CoSpecConfig
from selfspec.spec.draft_model import DraftModelConfig
from selfspec.spec.ngram import PromptLookupConfig
from selfspec.spec.ssr import SSRConfig
from selfspec.spec.suffix import SuffixDecodingConfig, SuffixOptions
from selfspec.thinking.policy import ThinkingLimits

SpecConfig = Annotated[
    Union[AutoConfig, OffConfig, SSRConfig, SuffixDecodingConfig, PromptLookupConfig, DraftModelConfig, CoSpecConfig],
    Field(discriminator="method"),
]
"""Any one speculation method's config, chosen by its `method` field."""


def _baseline_method(value: Any) -> str:
    """The classic methods' discriminator; a body that names no method gets suffix decoding."""
    if isinstance(value, dict):
        return value.get("method", "suffix")
    return getattr(value, "method", "suffix")


BaselineSpecConfig = Annotated[
    Union[
        Annotated[SuffixDecodingConfig, Tag("suffix")],
        Annotated[PromptLookupConfig, Tag("ngram")],
        Annotated[DraftModelConfig, Tag("draft")],
        Annotated[AutoConfig, Tag("auto")],
        Annotated[OffConfig, Tag("off")],
    ],
    Discriminator(_baseline_method),
]
"""The lossless peers SSR is compared with (suffix decoding, prompt lookup, draft model), auto
(the default policy) and off (plain decoding): what the server's `speculation` field takes."""

_spec_adapter: TypeAdapter = TypeAdapter(SpecConfig)
_baseline_adapter: TypeAdapter = TypeAdapter(BaselineSpecConfig)

METHODS: tuple[str, ...] = ("auto", "off", "ssr", "suffix", "ngram", "draft", "cospec")


def parse_spec(data: str | dict[str, Any] | MethodConfig) -> MethodConfig:
    """A speculation config from a method name ("auto", "off", "ngram", ...: its defaults), a
    dict with a `method` key, or a config (returned as is)."""
    if isinstance(data, MethodConfig):
        return data
    if isinstance(data, str):
        data = {"method": data}
    return _spec_adapter.validate_python(data)


def parse_baseline_spec(data: dict[str, Any] | MethodConfig) -> MethodConfig:
    """One of the classic methods from a dict (suffix decoding when no `method` is given)."""
    if isinstance(data, MethodConfig):
        return data
    return _baseline_adapter.validate_python(data)


__all__ = [
    "AutoConfig",
    "BaselineSpecConfig",
    "CoSpecConfig",
    "DraftModelConfig",
    "EngineConfig",
    "METHODS",
    "MethodConfig",
    "OffConfig",
    "PromptLookupConfig",
    "SSRConfig",
    "SpecConfig",
    "SuffixDecodingConfig",
    "SuffixOptions",
    "ThinkingLimits",
    "parse_baseline_spec",
    "parse_spec",
]
