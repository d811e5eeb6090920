"""Server settings: what the CLI flags set, and the defaults requests inherit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from selfspec.spec.base import MethodConfig
from selfspec.spec.ssr import SSRConfig


@dataclass
class CoSpecDefaults:
    """CoSpec as this server offers it (CLI: `--draft`, `--arbitrator`, `--cospec-threshold`).

    CoSpec is lossy, so it is never a default mode: a request opts in with a `cospec`
    object in its `selfspec` options and gets these values for the fields it leaves out.
    `arbitrator` is a loaded `selfspec.spec.cospec.Arbitrator` on the served LLM's draft.
    """

    arbitrator: Any
    threshold: float = 0.6
    num_speculative_tokens: int = 25
    max_prefix_tokens: int = 512

    def __post_init__(self) -> None:
        if self.arbitrator is None:
            raise ValueError("CoSpec needs an arbitrator")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"the CoSpec threshold must lie in [0, 1], got {self.threshold}")
        if not 1 <= self.num_speculative_tokens <= 64:
            raise ValueError(f"the CoSpec draft block must hold 1..64 tokens, got {self.num_speculative_tokens}")
        if self.max_prefix_tokens < 1:
            raise ValueError("max_prefix_tokens must be >= 1")


@dataclass
class RequestDefaults:
    """Applied to every request that does not say otherwise (CLI: `--ssr`, `--cot-cap`, ...).

    temperature: 0 (greedy) unlike OpenAI's 1.0: selfspec's promise is the model's own
      greedy answer, sooner; clients that want sampling say so.
    max_tokens: cap for requests that give none (None: whatever room the context leaves).
    """

    ssr: SSRConfig | None = None
    speculation: MethodConfig | None = None  # one of `selfspec.config.BaselineSpecConfig`
    thinking: bool | None = None
    cot_cap: int | None = None
    answer_cap: int | None = None
    fixed_length: bool = False
    temperature: float = 0.0
    max_tokens: int | None = None
    cospec: CoSpecDefaults | None = None  # only requests that ask for it run CoSpec

    def __post_init__(self) -> None:
        if self.ssr is not None and self.speculation is not None:
            raise ValueError("choose SSR or speculation as the default, not both")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("the default max_tokens must be >= 1")


@dataclass
class ServerConfig:
    """How the HTTP layer behaves.

    served_model_names: the names `model` may take in a request (the first is listed
      first by /v1/models).
    max_queue: requests that may wait for a slot beyond the `num_slots` running ones;
      more get 429 with Retry-After.
    request_timeout_s: a request still running after this many seconds is cancelled.
    api_key: when set, /v1 endpoints need `Authorization: Bearer <api_key>`.
    body_timeout_s: a request body still incomplete after this many seconds gets 408 (a request
      head has its own deadline, `connections.HEADER_TIMEOUT_S`).
    grammar_compile_timeout_s: a request's grammar (response_format, a forced tool call) still
      compiling after this many seconds is refused (400); see `grammar_compile`.
    """

    served_model_names: list[str] = field(default_factory=lambda: ["selfspec"])
    max_queue: int = 64
    request_timeout_s: float = 600.0
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float = 30.0
    grammar_compile_timeout_s: float = 30.0
    defaults: RequestDefaults = field(default_factory=RequestDefaults)

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")
        if self.max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be > 0")
        if not self.body_timeout_s > 0:
            raise ValueError("body_timeout_s must be > 0")
        if not self.grammar_compile_timeout_s > 0:
            raise ValueError("grammar_compile_timeout_s must be > 0")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the api key must not be empty")
