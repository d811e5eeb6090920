"""Server settings: what the CLI flags set, and the defaults requests inherit."""

from __future__ import annotations

from dataclasses import dataclass, field

from selfspec.policies.speculative import SpeculationConfig
from selfspec.ssr.config import SSRConfig


@dataclass
class RequestDefaults:
    """Applied to every request that does not say otherwise (CLI: `--ssr`, `--cot-cap`, ...).

    temperature: 0 (greedy) unlike OpenAI's 1.0: selfspec's promise is the model's own
      greedy answer, sooner; clients that want sampling say so.
    max_tokens: cap for requests that give none (None: whatever room the context leaves).
    """

    ssr: SSRConfig | None = None
    speculation: SpeculationConfig | None = None
    thinking: bool | None = None
    cot_cap: int | None = None
    answer_cap: int | None = None
    fixed_length: bool = False
    temperature: float = 0.0
    max_tokens: int | None = None

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
    """

    served_model_names: list[str] = field(default_factory=lambda: ["selfspec"])
    max_queue: int = 64
    request_timeout_s: float = 600.0
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    defaults: RequestDefaults = field(default_factory=RequestDefaults)

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")
        if self.max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be > 0")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the api key must not be empty")
