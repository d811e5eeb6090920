"""From a validated body to what the engine runs: prompt ids, sampling, speculation, limits.

Everything a client can get wrong is checked here, before the request reaches the
engine thread, and raised as a 400 that names the field: the prompt (empty, unknown
roles, longer than the context), `max_tokens` beyond the room the context leaves, token
ids outside the vocabulary, SSR options that do not validate once merged over the
server's defaults, CoSpec asked of a server without an arbitrator or with sampling, and any
feature the backend does not run (`backend.Capabilities`). Runs in a worker thread (tokenizing
and chat templates take time); it reads the tokenizer and the engine's sizes, never the
engine's state.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from selfspec.config import parse_baseline_spec
from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
from selfspec.server.backend import ServingBackend, as_backend
from selfspec.server.config import RequestDefaults
from selfspec.server.errors import APIError, clean_library_message, from_validation_error
from selfspec.server.schemas import ChatCompletionRequest, CompletionRequest, CoSpecOptions, SelfspecOptions
from selfspec.server.structured import OutputRules, output_rules
from selfspec.spec.base import MethodConfig
from selfspec.spec.cospec.policy import CoSpecConfig
from selfspec.spec.ssr import SSRConfig
from selfspec.thinking.policy import ThinkingLimits

log = logging.getLogger("selfspec.server")

Spec = MethodConfig | None  # SSR, a classic method, or CoSpec


@dataclass
class RequestPlan:
    prompt_ids: list[int]
    params: SamplingParams
    spec: Spec
    limits: ThinkingLimits | None
    thinking: bool | None
    mode: str  # "plain" | "auto" | "ssr" | "suffix" | "ngram" | "draft" | "cospec" (the one lossy mode)
    timeout_s: float
    rules: OutputRules = field(default_factory=OutputRules)  # grammar and tool-call parser

    @property
    def grammar(self) -> Any:
        return self.rules.grammar


def _is_on(value: Any) -> bool:
    return value is not None and value is not False


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _merge_config(
    parse: Callable[[dict], BaseModel], default: BaseModel | None, requested: BaseModel, name: str
) -> BaseModel:
    """The request's fields over the server's defaults (only the fields it set). A request that
    names another method than the server's default takes none of the default's fields."""
    if default is None or getattr(default, "method", None) != getattr(requested, "method", None):
        return requested
    data = _deep_merge(default.model_dump(), requested.model_dump(exclude_unset=True))
    try:
        return parse(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=f"selfspec.{name}") from None


def resolve_cospec(options: SelfspecOptions, defaults: RequestDefaults) -> CoSpecConfig:
    """The request's CoSpec settings over the server's; 400 when the server has no arbitrator."""
    served = defaults.cospec
    if served is None:
        raise APIError(
            400,
            "this server offers no CoSpec: start it with --arbitrator (and --draft) to allow selfspec.cospec",
            param="selfspec.cospec",
            code="cospec_unavailable",
        )
    requested = options.cospec if isinstance(options.cospec, CoSpecOptions) else CoSpecOptions()
    return CoSpecConfig(
        num_speculative_tokens=requested.num_speculative_tokens or served.num_speculative_tokens,
        threshold=served.threshold if requested.threshold is None else requested.threshold,
        max_prefix_tokens=served.max_prefix_tokens,
        arbitrator=served.arbitrator,
    )


def resolve_spec(options: SelfspecOptions, defaults: RequestDefaults) -> tuple[Spec, str]:
    """Which speculation the request runs: its own choice, else the server's default.

    CoSpec is never a default (it is lossy): only a request that names it runs it.
    """
    if options.cospec is not None and options.cospec is not False:
        return resolve_cospec(options, defaults), "cospec"
    chosen: dict[str, BaseModel | None] = {}
    for name, parse, default in (
        ("ssr", SSRConfig.model_validate, defaults.ssr),
        ("speculation", parse_baseline_spec, defaults.speculation),
    ):
        value = getattr(options, name)
        if value is None:
            continue
        if value is False:
            chosen[name] = None
        elif value is True:
            chosen[name] = default if default is not None else parse({})
        else:
            chosen[name] = _merge_config(parse, default, value, name)
    if "ssr" in chosen or "speculation" in chosen:
        spec = chosen.get("ssr") or chosen.get("speculation")
    else:
        spec = defaults.ssr or defaults.speculation
    if spec is None or spec.method == "off":
        return None, "plain"
    return spec, spec.method


def resolve_limits(options: SelfspecOptions, defaults: RequestDefaults) -> ThinkingLimits | None:
    cot_cap = options.cot_cap if options.cot_cap is not None else defaults.cot_cap
    answer_cap = options.answer_cap if options.answer_cap is not None else defaults.answer_cap
    fixed = options.fixed_length if options.fixed_length is not None else defaults.fixed_length
    if cot_cap is None and answer_cap is None and not fixed:
        return None
    limits = ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap, fixed_length=fixed)
    try:
        limits.validate()
    except ValueError as exc:
        raise APIError(400, str(exc), param="selfspec.fixed_length" if fixed else "selfspec.cot_cap") from None
    return limits


_PARAM_NAME = re.compile(r"invalid sampling parameter (\w+)=")


_SPEC_FIELD = {"ssr": "selfspec.ssr", "cospec": "selfspec.cospec"}


def _refuse(backend: ServingBackend, param: str, what: str, why: str = "") -> APIError:
    return APIError(
        400,
        f"{what} is not supported with the {backend.capabilities.backend} backend" + (f": {why}" if why else ""),
        param=param,
        code="unsupported_feature",
    )


def resolve_for(
    body: ChatCompletionRequest | CompletionRequest, defaults: RequestDefaults, backend: ServingBackend
) -> tuple[Spec, str]:
    """`resolve_spec`, then a 400 naming the first field that asks for what `backend` does not run."""
    if body.options.cospec not in (None, False) and "cospec" not in backend.capabilities.modes:
        raise _refuse(backend, "selfspec.cospec", "CoSpec")
    spec, mode = resolve_spec(body.options, defaults)
    check_capabilities(body, mode, spec, backend)
    return spec, mode


def check_capabilities(
    body: ChatCompletionRequest | CompletionRequest, mode: str, spec: Spec, backend: ServingBackend
) -> None:
    """A 400 naming the first field that asks for what `backend` does not run."""
    caps = backend.capabilities

    def refuse(param: str, what: str, why: str = "") -> APIError:
        return _refuse(backend, param, what, why)

    if mode not in caps.modes:
        field = _SPEC_FIELD.get(mode, "selfspec.speculation")
        raise refuse(field, "CoSpec" if mode == "cospec" else f"speculation mode {mode!r}")
    unsupported = backend.unsupported_spec(spec) if spec is not None else None
    if unsupported is not None:
        name, why = unsupported
        param = f"{_SPEC_FIELD.get(mode, 'selfspec.speculation')}.{name}"
        raise refuse(param, param, why)
    if not caps.structured_output:
        options, response_format = body.options, getattr(body, "response_format", None)
        asked = (
            (
                "response_format",
                "structured output (response_format)",
                response_format is not None and response_format.type != "text",
            ),
            ("tool_choice", "a forced tool call", isinstance(body, ChatCompletionRequest) and body.calls_forced),
            ("selfspec.regex", "structured output (selfspec.regex)", options.regex is not None),
            ("selfspec.grammar", "structured output (selfspec.grammar)", options.grammar is not None),
        )
        for param, what, wanted in asked:
            if wanted:
                raise refuse(param, what)
    if not caps.logprobs and body.logprobs_count is not None:
        raise refuse("logprobs", "logprobs")
    if body.n > caps.max_n:
        raise refuse("n", f"n > {caps.max_n}")
    if not caps.min_tokens and body.min_tokens:
        raise refuse("min_tokens", "min_tokens")


class RequestPlanner:
    """Builds `RequestPlan`s for one backend (or `LLM`) under the server's defaults."""

    def __init__(self, backend: ServingBackend | Any, defaults: RequestDefaults, request_timeout_s: float) -> None:
        self.backend = backend = as_backend(backend)
        self.tokenizer = backend.tokenizer
        self.defaults = defaults
        self.request_timeout_s = request_timeout_s
        self.max_len = backend.max_len
        self.vocab_size = backend.vocab_size

    # ------------------------------------------------------------------ entry points
    def plan_chat(self, body: ChatCompletionRequest) -> RequestPlan:
        spec, mode = resolve_for(body, self.defaults, self.backend)
        thinking, spec, mode = self._thinking(body.requested_thinking, spec, mode, body.options)
        rules = output_rules(self.backend, body)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.uses_tools else None
        try:
            prompt_ids = self.backend.encode_prompt(body.template_messages(), thinking=thinking, tools=tools)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        except Exception as exc:  # noqa: BLE001 - a template/tokenizer rejecting this input
            log.warning("chat template failed on a request: %r", exc)
            reason = clean_library_message(str(exc), type(exc).__name__)
            raise APIError(400, f"could not build the prompt from these messages: {reason}", param="messages") from None
        return self._finish(body, prompt_ids, spec, mode, thinking, prompt_field="messages", rules=rules)

    def plan_completion(self, body: CompletionRequest) -> RequestPlan:
        options = body.options
        spec, mode = resolve_for(body, self.defaults, self.backend)
        # A raw completion continues the text as given: no thinking unless asked for.
        requested = options.thinking
        if requested is None and spec is None:
            requested = False
        thinking, spec, mode = self._thinking(requested, spec, mode, options)
        rules = output_rules(self.backend, body)
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            if not prompt.strip():
                raise APIError(400, "prompt is empty", param="prompt")
            try:
                prompt_ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
            except Exception as exc:  # noqa: BLE001 - the tokenizer rejecting this text
                log.warning("tokenizer failed on a prompt: %r", exc)
                reason = clean_library_message(str(exc), type(exc).__name__)
                raise APIError(400, f"could not tokenize the prompt: {reason}", param="prompt") from None
        else:
            prompt_ids = list(prompt)
            if not prompt_ids:
                raise APIError(400, "prompt is empty", param="prompt")
            bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise APIError(
                    400,
                    f"prompt holds token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}",
                    param="prompt",
                )
        return self._finish(body, prompt_ids, spec, mode, thinking, prompt_field="prompt", rules=rules)

    # ------------------------------------------------------------------ shared
    def _thinking(
        self, requested: bool | None, spec: Spec, mode: str, options: SelfspecOptions
    ) -> tuple[bool | None, Spec, str]:
        """Whether the request thinks, and its speculation. SSR speculates on a chain of thought:
        on a model that thinks by default it turns thinking on; on one that does not (SmolLM2's
        thinking is only prompted) it never does so silently: a request naming `selfspec.ssr`
        must also ask for thinking (else 400), and the server's default SSR is left to the
        requests that think (the others run plain)."""
        thinking = requested if requested is not None else self.defaults.thinking
        if thinking is None and getattr(spec, "needs_thinking", False):
            if self.backend.thinking_enabled(None):
                thinking = True
            elif _is_on(options.ssr):
                raise APIError(
                    400,
                    "SSR speculates on a chain of thought and this model does not think by default: "
                    "ask for thinking as well (selfspec.thinking: true, prompted thinking) or leave selfspec.ssr off",
                    param=_SPEC_FIELD.get(mode, "selfspec.speculation"),
                    code="thinking_required",
                )
            else:
                spec, mode = None, "plain"
        return thinking, spec, mode

    def _finish(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        prompt_ids: list[int],
        spec: Spec,
        mode: str,
        thinking: bool | None,
        *,
        prompt_field: str,
        rules: OutputRules,
    ) -> RequestPlan:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty after tokenization", param=prompt_field)
        room = self.max_len - len(prompt_ids)
        if room < 1:
            raise APIError(
                400,
                f"this model's context holds {self.max_len} tokens; the prompt has {len(prompt_ids)} "
                "(at least one position must remain for the answer)",
                param=prompt_field,
                code="context_length_exceeded",
            )
        limit_field = (
            "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
        )
        max_tokens = body.completion_limit
        if max_tokens is None:
            max_tokens = min(room, self.defaults.max_tokens or room)
        elif max_tokens > room:
            raise APIError(
                400,
                f"this model's context holds {self.max_len} tokens; the prompt has {len(prompt_ids)}, "
                f"so {limit_field} may be at most {room} (got {max_tokens})",
                param=limit_field,
                code="context_length_exceeded",
            )
        if body.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens")
        stop_ids = body.stop_token_ids or []
        bad = [t for t in stop_ids if t >= self.vocab_size]
        if bad:
            raise APIError(
                400, f"stop_token_ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", param="stop_token_ids"
            )
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=self.defaults.temperature if body.temperature is None else float(body.temperature),
                top_k=0 if body.top_k in (None, -1) else body.top_k,
                top_p=1.0 if body.top_p is None else float(body.top_p),
                min_p=0.0 if body.min_p is None else float(body.min_p),
                seed=body.seed,
                stop=list(body.stop or []),
                stop_token_ids=list(stop_ids),
                ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens,
                presence_penalty=float(body.presence_penalty or 0.0),
                frequency_penalty=float(body.frequency_penalty or 0.0),
                repetition_penalty=1.0 if body.repetition_penalty is None else float(body.repetition_penalty),
                logprobs=body.logprobs_count,
                n=body.n,
            )
        except InvalidSamplingParams as exc:
            match = _PARAM_NAME.search(str(exc))
            raise APIError(400, str(exc), param=match.group(1) if match else None) from None
        unsupported = self.backend.unsupported_params(params)
        if unsupported is not None:
            name, why = unsupported
            raise _refuse(self.backend, name, name, why)
        if mode == "cospec" and not params.greedy:
            raise APIError(
                400,
                "CoSpec arbitrates greedy verification tokens: send temperature 0 with selfspec.cospec",
                param="temperature",
            )
        if rules.spec is not None:  # compiled later, by `grammar_compile`, never on this thread
            rules.gated = self.backend.thinking_enabled(thinking)
        if mode == "cospec" and (rules.spec is not None or params.n > 1):
            raise APIError(
                400,
                "CoSpec runs one unconstrained sample: send it without a grammar and with n=1",
                param="selfspec.cospec",
            )
        limits = resolve_limits(body.options, self.defaults)
        timeout = self.request_timeout_s
        if body.options.timeout_s is not None:
            timeout = min(timeout, body.options.timeout_s)
        return RequestPlan(prompt_ids, params, spec, limits, thinking, mode, timeout, rules)
