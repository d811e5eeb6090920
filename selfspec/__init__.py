"""selfspec: reasoning models answer sooner without changing what they say.

    from selfspec import LLM, SamplingParams, ThinkingLimits, SSRConfig

    llm = LLM("smollm2-thinker-v4b")
    [result] = llm.generate(prompt, SamplingParams(max_tokens=1200),
                            limits=ThinkingLimits(cot_cap=800, answer_cap=400),
                            spec=SSRConfig(draft_budgets=[300]))

Importing this package loads the engine and the method configs only: the HTTP server
(FastAPI), LoRA support (peft), the bench harness and the research code load on use.
"""

from selfspec.config import (
    CoSpecConfig,
    DraftModelConfig,
    EngineConfig,
    PromptLookupConfig,
    SpecConfig,
    SSRConfig,
    SuffixDecodingConfig,
    SuffixOptions,
    ThinkingLimits,
    parse_spec,
)
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM, GenerationResult, Timings
from selfspec.thinking.format import ThinkingFormat

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "CoSpecConfig",
    "DraftModelConfig",
    "EngineConfig",
    "GenerationResult",
    "PromptLookupConfig",
    "SSRConfig",
    "SamplingParams",
    "SpecConfig",
    "SuffixDecodingConfig",
    "SuffixOptions",
    "ThinkingFormat",
    "ThinkingLimits",
    "Timings",
    "parse_spec",
]
