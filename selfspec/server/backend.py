"""What the server needs of an engine: the one interface the HTTP layer and the engine loop use.

A backend answers two sides. The planner (worker threads, read-only) asks for the tokenizer,
the context size, prompt encoding, grammars, and what the backend can run (`Capabilities`:
a request for anything else is a 400 naming the field). The engine loop (one thread) admits
jobs, steps, aborts, and reads each sample's tokens and result. A sample is whatever handle
the backend returns from `admit`; the loop only passes it back.

`LocalBackend` serves this package's `LLM` (every feature). The vLLM backend
(`selfspec.integrations.vllm.serving.VLLMBackend`) serves SSR over an unmodified vLLM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from selfspec.thinking.policy import ThinkingPolicy

if TYPE_CHECKING:
    from selfspec.llm import GenerationResult
    from selfspec.server.engine_loop import EngineJob

ALL_MODES = frozenset({"plain", "auto", "ssr", "suffix", "ngram", "draft", "cospec"})


@dataclass(frozen=True)
class Capabilities:
    """What a backend runs. The planner refuses the rest with a 400 naming the field.

    modes: request modes (`RequestPlan.mode`) it runs; structured_output: grammars
    (`response_format`, forced tool calls, `selfspec.regex` / `grammar`); logprobs; max_n: the
    most samples per request; min_tokens: a lower bound on the output length.
    """

    backend: str = "selfspec"
    modes: frozenset[str] = ALL_MODES
    structured_output: bool = True
    logprobs: bool = True
    max_n: int = 64
    min_tokens: bool = True


@dataclass
class Admission:
    """A job the backend took: its samples (choice 0 first), prompt length, whether it thinks."""

    samples: list[Any]
    prompt_tokens: int
    thinking: bool


@dataclass
class EngineCounts:
    """The backend's share of `LoopStats`."""

    waiting: int = 0
    running: int = 0
    slots_in_use: int = 0
    slots_total: int = 0
    steps: int = 0


@dataclass
class SampleTokens:
    """A sample's tokens so far: `ids[start:]` is its output (`ids` may begin with the prompt)."""

    ids: list[int]
    start: int
    finished: bool
    logprobs: list[Any] | None = field(default=None)


class ServingBackend(ABC):
    """The engine side of the server (see the module docstring)."""

    capabilities: Capabilities = Capabilities()
    tokenizer: Any
    thinking_format: Any
    model_name: str
    tool_call_parser: str | None = None
    """The tool-call family the server was told (`--tool-call-parser`); None: read it from the template."""

    # ------------------------------------------------------------------ the planner's side
    @property
    @abstractmethod
    def max_len(self) -> int:
        """Context length: prompt plus output tokens."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def num_slots(self) -> int:
        """Requests decoded together; the loop queues `max_queue` more."""

    @abstractmethod
    def encode_prompt(self, prompt: Any, *, thinking: bool | None = None, tools: list[dict] | None = None) -> list[int]:
        """Token ids of a prompt (ValueError: the prompt is at fault)."""

    @abstractmethod
    def thinking_enabled(self, thinking: bool | None) -> bool:
        """Whether a request asking `thinking` (None: the model's default) thinks first."""

    @property
    def grammars(self) -> Any:
        raise ImportError(f"structured output is not available with the {self.capabilities.backend} backend")

    def unsupported_spec(self, spec: Any) -> tuple[str, str] | None:
        """(field under `selfspec.`, why) for a method setting this backend does not run."""
        return None

    def unsupported_params(self, params: Any) -> tuple[str, str] | None:
        """(field, why) for a sampling parameter (`SamplingParams`) this backend does not honour."""
        return None

    # ------------------------------------------------------------------ the engine thread
    @abstractmethod
    def admit(self, job: "EngineJob") -> Admission:
        """Start a job. ValueError: the request is at fault (400)."""

    @abstractmethod
    def has_unfinished(self) -> bool: ...

    @abstractmethod
    def step(self) -> None: ...

    @abstractmethod
    def abort(self, request_id: str) -> None: ...

    @abstractmethod
    def counts(self) -> EngineCounts: ...

    @abstractmethod
    def tokens(self, sample: Any, since: int) -> SampleTokens:
        """The sample's tokens; `logprobs` covers `ids[since:]` when the request asked for them."""

    @abstractmethod
    def answer_start(self, sample: Any) -> int | None:
        """Index in the output of the first answer token (None: no thinking, or not yet)."""

    @abstractmethod
    def result(self, sample: Any) -> "GenerationResult": ...


class LocalBackend(ServingBackend):
    """This package's `LLM` and engine: every mode and feature."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.thinking_format = llm.thinking_format
        self.model_name = getattr(llm, "model_name", "selfspec")

    @property
    def max_len(self) -> int:
        return self.llm.engine.max_len

    @property
    def vocab_size(self) -> int:
        return self.llm.engine.vocab_size

    @property
    def num_slots(self) -> int:
        return self.llm.engine.config.num_slots

    def encode_prompt(self, prompt: Any, *, thinking: bool | None = None, tools: list[dict] | None = None) -> list[int]:
        return self.llm.encode_prompt(prompt, thinking=thinking, tools=tools)

    def thinking_enabled(self, thinking: bool | None) -> bool:
        return self.llm.thinking_enabled(thinking)

    @property
    def grammars(self) -> Any:
        return self.llm.grammars

    def admit(self, job: "EngineJob") -> Admission:
        seq = self.llm.submit(
            job.prompt_ids,
            job.params,
            spec=job.spec,
            limits=job.limits,
            thinking=job.thinking,
            request_id=job.request_id,
            grammar=job.grammar,
        )
        return Admission([seq, *seq.siblings], seq.prompt_len, _thinks(seq))

    def has_unfinished(self) -> bool:
        return self.llm.engine.has_unfinished()

    def step(self) -> None:
        self.llm.engine.step()

    def abort(self, request_id: str) -> None:
        self.llm.engine.abort_request(request_id)

    def counts(self) -> EngineCounts:
        engine = self.llm.engine
        return EngineCounts(
            waiting=engine.num_waiting,
            running=engine.num_running,
            slots_in_use=engine.scheduler.slots.num_used,
            slots_total=engine.config.num_slots,
            steps=engine.steps,
        )

    def tokens(self, sample: Any, since: int) -> SampleTokens:
        ids, start = sample.token_ids, sample.prompt_len
        logprobs = None
        if sample.params.logprobs is not None:
            logprobs = sample.logprobs[max(since - start, 0) : len(ids) - start]
        return SampleTokens(ids, start, sample.is_finished, logprobs)

    def answer_start(self, sample: Any) -> int | None:
        if not _thinks(sample):
            return None
        start = sample.policy.metrics.answer_start
        return None if start is None else start - sample.prompt_len

    def result(self, sample: Any) -> "GenerationResult":
        return self.llm.result(sample)


def _thinks(seq: Any) -> bool:
    policy = seq.policy
    return isinstance(policy, ThinkingPolicy) and policy.thinking


def as_backend(served: Any) -> ServingBackend:
    """A backend as is; an `LLM` (or anything shaped like one) in a `LocalBackend`."""
    return served if isinstance(served, ServingBackend) else LocalBackend(served)
