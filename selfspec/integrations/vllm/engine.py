"""The driver: SSR over an unmodified vLLM `LLMEngine`.

A user request is a sequence of vLLM requests, all served from vLLM's prefix cache:

1. the parent's thinking request (prompt ids; its CoT cap is its `max_tokens`);
2. at each draft budget, a draft child: prompt + CoT so far + the end-of-thinking tokens, so
   only the tokens after the parent's last full cache block are prefilled, and it runs in
   the same batched steps as the parent; `draft_schedule.DraftSchedule` decides when, and cancels
   superseded drafts (an abort);
3. when the parent ends thinking (its own marker, or the cap: the close tokens are appended
   here, as our engine's forced close), running drafts are aborted and the parent continues
   as an answer request (prompt + CoT, again from the prefix cache) whose `extra_args` carry
   the drafts; the worker's `SSRProposer` proposes them and vLLM's rejection sampler
   verifies. Tokens the thinking request produced past its close are dropped: the decision
   to drop does not depend on their values, so sampling keeps its distribution.

The baseline (`speculation=False`) runs the same request sequence on a vLLM without a
speculative config, so SSR's output is compared with vLLM's own plain decoding.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from selfspec.engine.llm_engine import check_prompt_ids
from selfspec.engine.sampling import SamplingParams
from selfspec.integrations.vllm.compat import check_vllm
from selfspec.integrations.vllm.handoff import answer_args, draft_args
from selfspec.integrations.vllm.logprobs import token_logprobs
from selfspec.llm import GenerationResult, Timings
from selfspec.spec.draft_schedule import DraftSchedule
from selfspec.spec.ssr_core import Draft, SSRConfig
from selfspec.thinking.format import EndOfThinkingMatcher, ThinkingFormat, encode_prompt, thinking_enabled
from selfspec.thinking.policy import ClosedBy, ThinkingLimits

PROPOSER = "selfspec.integrations.vllm.proposer.SSRProposer"
WORKER_EXTENSION = "selfspec.integrations.vllm.proposer.SSRWorkerExtension"

MAX_N = 1
"""Samples per request the driver runs."""

_MASK64 = (1 << 64) - 1


def derived_seed(seed: int | None, stream: int) -> int | None:
    """The seed of a request's `stream`-th vLLM request after its first (splitmix64 of both).

    vLLM seeds a generator per request, so an answer request given the thinking request's seed
    would replay the CoT's random numbers: its tokens would be tied to the CoT's, not sampled
    afresh. Each later request of one user request gets a seed of its own, unrelated to the
    seeds of requests whose seeds are near it."""
    if seed is None:
        return None
    x = (seed + 0x9E3779B97F4A7C15 * (stream + 1)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1  # 63 bits: a valid seed everywhere


_ANSWER_STREAM = 0  # drafts use 1 + their index

_UNSUPPORTED = {
    "use_draft_probs": "vLLM's custom proposer returns token ids only, so drafts are verified as one-hot proposals",
    "speculate_thinking": "the vLLM backend does not speculate the chain of thought",
}


def unsupported_ssr_option(config: SSRConfig) -> tuple[str, str] | None:
    """(field, why) of the first SSR setting the vLLM backend does not run, or None."""
    for name, why in _UNSUPPORTED.items():
        if getattr(config, name):
            return name, why
    if "global" in config.suffix_sources:
        return "suffix_sources", "the 'global' source needs a history shared across requests"
    return None


def check_ssr_config(config: SSRConfig) -> None:
    """Refuse what the vLLM backend does not run (ValueError naming the field)."""
    unsupported = unsupported_ssr_option(config)
    if unsupported is not None:
        name, why = unsupported
        raise ValueError(f"ssr.{name} is not supported with the vLLM backend: {why}")


@dataclass
class VLLMRequest:
    """One user request as the driver follows it."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    limits: ThinkingLimits
    spec: SSRConfig | None
    thinking: bool
    fmt: ThinkingFormat
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)  # per token when asked for (None: a forced token)
    cot_tokens: int = 0
    answering: bool = False
    closed_by: ClosedBy = ClosedBy.NOT_YET
    reasoning_end: int | None = None  # index in `tokens` where the end marker begins
    answer_start: int | None = None  # index in `tokens` of the first answer token
    active: str | None = None  # the vLLM request now carrying the parent
    schedule: DraftSchedule | None = None
    drafts: dict[str, Draft] = field(default_factory=dict)  # vLLM id -> draft, running or not
    running: set[str] = field(default_factory=set)
    finished: bool = False
    finish_reason: str = "running"
    finish_detail: str = ""
    answer_forwards: int = 0
    forwards: int = 0  # vLLM steps that gave the parent tokens (thinking and answer)
    worker_metrics: dict[str, Any] = field(default_factory=dict)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    thinking_end_time: float | None = None
    first_answer_time: float | None = None
    finish_time: float | None = None
    matcher: EndOfThinkingMatcher | None = None

    @property
    def answer_tokens(self) -> int:
        return 0 if self.answer_start is None else len(self.tokens) - self.answer_start


class _Drafts:
    """`ssr_core.DraftBackend` over vLLM: a draft is a child request (prefix-cache hit)."""

    def __init__(self, engine: "VLLMEngine", req: VLLMRequest) -> None:
        self.engine, self.req = engine, req

    def fork_draft(self, draft: Draft, earlier: list[Draft]) -> str | None:
        req = self.req
        context = req.prompt_ids + req.tokens + draft.anchor
        if len(context) >= self.engine.max_len:
            return None  # no room left in the context for a draft's answer
        vid = f"{req.request_id}:draft{draft.index}"
        usable = [d for d in earlier if d.tokens] if req.spec.speculate_drafts else []
        seed = derived_seed(req.params.seed, 1 + draft.index)
        params = self.engine._vllm_params(
            req.params,
            max_tokens=req.spec.max_draft_len,
            seed=seed,
            extra=draft_args(req.spec, usable) if usable and self.engine.speculation else None,
            stops=False,
            logprobs=False,
        )
        self.engine._add(vid, context, params, req)
        req.running.add(vid)
        req.drafts[vid] = draft
        return vid

    def cancel_draft(self, draft: Draft, reason: str) -> None:
        self.engine._abort(draft.seq, self.req)

    def draft_running(self, draft: Draft) -> bool:
        return draft.seq in self.req.running


class VLLMEngine:
    """SSR on vLLM: submit requests, `step()` until they finish, read `result()`.

    `model`: a local HF directory (or whatever vLLM loads). `speculation=False` builds vLLM
    without a speculative config (the baseline). `engine_args` go to `vllm.EngineArgs`
    (e.g. `tensor_parallel_size`, `max_model_len`, `dtype`). vLLM's engine core runs in this
    process unless `multiprocessing=True` (`VLLM_ENABLE_V1_MULTIPROCESSING`, read by vLLM at
    construction)."""

    def __init__(
        self,
        model: str,
        *,
        speculation: bool = True,
        num_speculative_tokens: int = 16,
        multiprocessing: bool = False,
        tokenizer: Any = None,
        **engine_args: Any,
    ) -> None:
        self.vllm_version = check_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        from transformers import AutoTokenizer
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.speculation = speculation
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
        self.thinking_format = ThinkingFormat.detect(self.tokenizer)
        args: dict[str, Any] = dict(enable_prefix_caching=True, async_scheduling=False, seed=0)
        if speculation:
            args.update(
                speculative_config={
                    "method": "custom_class",
                    "model": PROPOSER,
                    "num_speculative_tokens": num_speculative_tokens,
                },
                worker_extension_cls=WORKER_EXTENSION,
            )
        args.update(engine_args)
        self.engine = LLMEngine.from_engine_args(EngineArgs(model=model, **args))
        # {sampling parameter: why} for what this vLLM's rejection sampler gets wrong (probed).
        self.sampler_issues: dict[str, str] = {}
        if speculation:
            self.engine.collective_rpc("selfspec_ssr_attach")
            self.sampler_issues = self.check_sampler()
        self.requests: dict[str, VLLMRequest] = {}
        self._owner: dict[str, VLLMRequest] = {}  # vLLM id -> the user request it serves
        self._ids = itertools.count()
        self.steps = 0

    # ------------------------------------------------------------------ requests
    def check_sampler(self) -> dict[str, str]:
        """Every worker's rejection-sampler probe (`proposer.sampler_issues`), merged."""
        issues: dict[str, str] = {}
        for found in self.engine.collective_rpc("selfspec_ssr_sampler_issues"):
            issues.update(found)
        return issues

    def unsupported_sampling(self, params: SamplingParams) -> tuple[str, str] | None:
        """(field, why) of a sampling parameter this engine cannot honour, or None. Only an engine
        with the SSR proposer has limits: vLLM's speculative decoding refuses min_p, and the
        probed sampler issues rule out sampling (or top-k) where vLLM would get them wrong."""
        if not self.speculation:
            return None
        if params.min_p > 0:
            return "min_p", "vLLM does not run min_p with speculative decoding"
        if params.temperature > 0 and "temperature" in self.sampler_issues:
            return "temperature", self.sampler_issues["temperature"]
        if params.temperature > 0 and params.top_k > 0 and "top_k" in self.sampler_issues:
            return "top_k", self.sampler_issues["top_k"]
        return None

    @property
    def max_len(self) -> int:
        """The context length (vLLM's `max_model_len`)."""
        return int(self.engine.model_config.max_model_len)

    @property
    def vocab_size(self) -> int:
        return int(self.engine.model_config.get_vocab_size())

    def thinking_enabled(self, thinking: bool | None) -> bool:
        """Whether a request asking `thinking` (None: the model's default) thinks first: the
        rule of our `LLM`."""
        return thinking_enabled(self.thinking_format, thinking)

    def encode_prompt(
        self, prompt: str | list, thinking: bool | None = True, tools: list[dict] | None = None
    ) -> list[int]:
        enable = self.thinking_enabled(thinking)
        return encode_prompt(self.tokenizer, prompt, self.thinking_format, enable_thinking=enable, tools=tools)

    def submit(
        self,
        prompt: str | list,
        params: SamplingParams | None = None,
        *,
        spec: SSRConfig | None = None,
        limits: ThinkingLimits | None = None,
        thinking: bool | None = None,
        request_id: str | None = None,
    ) -> VLLMRequest:
        params = params or SamplingParams()
        params.validate()
        limits = limits or ThinkingLimits()
        limits.validate()
        if params.n > MAX_N:
            raise ValueError(f"the vLLM backend serves n={MAX_N} only")
        if spec is not None:
            check_ssr_config(spec)
        unsupported = self.unsupported_sampling(params)
        if unsupported is not None:
            name, why = unsupported
            raise ValueError(f"{name}={getattr(params, name)!r} is not supported on this vLLM: {why}")
        fmt = self.thinking_format
        # SSR thinks unless told not to (as `LLM.submit` does for methods that need thinking).
        thinking = self.thinking_enabled(True if thinking is None and spec is not None else thinking)
        prompt_ids = self.encode_prompt(prompt, thinking)
        check_prompt_ids(prompt_ids, self.max_len, self.vocab_size)
        req = VLLMRequest(
            request_id=request_id or f"r{next(self._ids)}",
            prompt_ids=prompt_ids,
            params=params,
            limits=limits,
            spec=spec,
            thinking=thinking,
            fmt=fmt,
        )
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is in use")
        self.requests[req.request_id] = req
        if thinking:
            req.matcher = EndOfThinkingMatcher(fmt)
            if spec is not None:
                req.schedule = DraftSchedule(spec, limits.cot_cap, True)
            cap = params.max_tokens if limits.cot_cap is None else min(params.max_tokens, limits.cot_cap)
            vparams = self._vllm_params(params, max_tokens=cap, ignore_eos=params.ignore_eos or limits.fixed_length)
            req.active = f"{req.request_id}:think"
        else:
            req.answer_start = 0
            req.answering = True
            vparams = self._vllm_params(params, max_tokens=self._answer_room(req))
            req.active = f"{req.request_id}:answer"
        self._add(req.active, req.prompt_ids, vparams, req)
        return req

    def cancel(self, req: VLLMRequest) -> None:
        """Abort a request: its parent and every draft still running."""
        if req.finished:
            return
        for vid in list(req.running):
            self._abort(vid, req)
        if req.active is not None:
            self._abort(req.active, req)
        self._finish(req, "cancelled", "cancelled")

    # ------------------------------------------------------------------ the loop
    @property
    def num_vllm_requests(self) -> int:
        """vLLM requests the driver holds: parents and running drafts."""
        return len(self._owner)

    def has_unfinished(self) -> bool:
        return any(not r.finished for r in self.requests.values())

    def step(self) -> list[VLLMRequest]:
        """One vLLM step; the user requests that finished in it."""
        done: list[VLLMRequest] = []
        self.steps += 1
        for out in self.engine.step():
            req = self._owner.get(out.request_id)
            if req is None or req.finished:
                continue
            completion = out.outputs[0]
            new = list(completion.token_ids)
            if out.request_id in req.drafts:
                self._on_draft(req, out.request_id, new, out.finished)
            elif out.request_id == req.active:
                lps = (
                    None
                    if req.params.logprobs is None
                    else token_logprobs(new, completion.logprobs, req.params.logprobs)
                )
                self._on_parent(req, new, lps, out.finished, completion.finish_reason, completion.stop_reason)
            if req.finished:
                done.append(req)
        return done

    def generate(self, prompts: list, params: SamplingParams | None = None, **kwargs: Any) -> list[GenerationResult]:
        reqs = [self.submit(p, params, **kwargs) for p in prompts]
        while any(not r.finished for r in reqs):
            self.step()
        return [self.result(r) for r in reqs]

    # ------------------------------------------------------------------ reacting
    def _on_draft(self, req: VLLMRequest, vid: str, new: list[int], finished: bool) -> None:
        if vid in req.running:
            req.drafts[vid].tokens.extend(new)
            if finished:
                req.running.discard(vid)
                self._owner.pop(vid, None)

    def _on_parent(
        self, req: VLLMRequest, new: list[int], lps: list | None, finished: bool, reason: str | None, stop: Any
    ) -> None:
        now = time.perf_counter()
        if new:
            req.forwards += 1
        if new and req.first_token_time is None:
            req.first_token_time = now
        if req.answering:
            req.answer_forwards += 1
            if new and req.first_answer_time is None:
                req.first_answer_time = now
            req.tokens.extend(new)
            if lps is not None:
                req.logprobs.extend(lps)
            if finished:
                self._finish(req, reason or "stop", "stop token" if stop is not None else (reason or ""))
            return
        for i, token in enumerate(new):
            req.tokens.append(token)
            if lps is not None:
                req.logprobs.append(lps[i])
            req.cot_tokens += 1
            if not req.limits.fixed_length and req.matcher.feed(token):
                req.reasoning_end = len(req.tokens) - req.matcher.matched_length()
                self._close_thinking(req, ClosedBy.MODEL, dropped=i + 1 < len(new) or not finished)
                return
            if req.limits.cot_cap is not None and req.cot_tokens >= req.limits.cot_cap:
                req.reasoning_end = len(req.tokens)
                req.tokens.extend(req.fmt.close_ids)
                if lps is not None:
                    req.logprobs.extend([None] * len(req.fmt.close_ids))
                self._close_thinking(req, ClosedBy.CAP, dropped=i + 1 < len(new) or not finished)
                return
        if finished:
            # EOS, a stop or max_tokens before thinking ended: the request ends in its CoT.
            self._finish(req, reason or "stop", reason or "")
            return
        if req.schedule is not None:
            req.schedule.on_cot(req.cot_tokens, list(req.fmt.close_ids), _Drafts(self, req))

    def _close_thinking(self, req: VLLMRequest, by: ClosedBy, dropped: bool) -> None:
        """Thinking is over: abort the thinking request and the running drafts, continue the
        parent as an answer request that carries the drafts to the proposer."""
        req.closed_by = by
        req.thinking_end_time = time.perf_counter()
        req.answering = True
        req.answer_start = len(req.tokens)
        old = req.active
        self._abort(old, req)
        extra = None
        if req.schedule is not None:
            usable = req.schedule.close(_Drafts(self, req))
            if usable and self.speculation and req.spec.reuse != "off":
                variants = [list(v) for v in (req.fmt.end_variants or (req.fmt.end_ids,))]
                key = f"{req.request_id}:answer"
                extra = answer_args(req.spec, usable, variants, len(req.prompt_ids) + req.answer_start, key)
        room = self._answer_room(req)
        if room <= 0:
            self._finish(req, "length", "max tokens")
            return
        req.active = f"{req.request_id}:answer"
        ignore_eos = req.params.ignore_eos or req.limits.fixed_length
        seed = derived_seed(req.params.seed, _ANSWER_STREAM)
        params = self._vllm_params(req.params, max_tokens=room, seed=seed, extra=extra, ignore_eos=ignore_eos)
        self._add(req.active, req.prompt_ids + req.tokens, params, req)

    def _answer_room(self, req: VLLMRequest) -> int:
        room = req.params.max_tokens - len(req.tokens)
        if req.limits.answer_cap is not None:
            room = min(room, req.limits.answer_cap)
        return room

    def _finish(self, req: VLLMRequest, reason: str, detail: str) -> None:
        req.finished = True
        req.finish_reason = {"abort": "cancelled"}.get(reason, reason)
        req.finish_detail = detail
        req.finish_time = time.perf_counter()
        for vid in list(req.running):
            self._abort(vid, req)
        if req.active is not None:
            if self.speculation and req.active.endswith(":answer"):
                found = [m for m in self.engine.collective_rpc("selfspec_ssr_collect", args=(req.active,)) if m]
                req.worker_metrics = found[0] if found else {}
            self._owner.pop(req.active, None)
        del self.requests[req.request_id]

    # ------------------------------------------------------------------ vLLM calls
    def _add(self, vid: str, prompt_ids: list[int], params: Any, req: VLLMRequest) -> None:
        self._owner[vid] = req
        self.engine.add_request(vid, {"prompt_token_ids": list(prompt_ids)}, params)

    def _abort(self, vid: str | None, req: VLLMRequest) -> None:
        if vid is None:
            return
        req.running.discard(vid)
        if self._owner.pop(vid, None) is not None:
            self.engine.abort_request([vid])

    def _vllm_params(
        self,
        params: SamplingParams,
        *,
        max_tokens: int,
        seed: int | None = None,
        extra: dict | None = None,
        ignore_eos: bool | None = None,
        stops: bool = True,
        logprobs: bool = True,
    ) -> Any:
        from vllm import SamplingParams as VParams
        from vllm.sampling_params import RequestOutputKind

        return VParams(
            max_tokens=max(1, max_tokens),
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else 0,  # 0: no top-k
            top_p=params.top_p,
            min_p=params.min_p,
            seed=params.seed if seed is None else seed,
            stop=list(params.stop) if stops else None,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos if ignore_eos is None else ignore_eos,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra,
            logprobs=params.logprobs if logprobs else None,
        )

    # ------------------------------------------------------------------ results
    def result(self, req: VLLMRequest) -> GenerationResult:
        end = req.finish_time or time.perf_counter()
        timings = Timings(
            ttft=None if req.first_token_time is None else req.first_token_time - req.arrival,
            total=end - req.arrival,
            thinking=None if req.thinking_end_time is None else req.thinking_end_time - req.arrival,
            first_answer_token=None if req.first_answer_time is None else req.first_answer_time - req.arrival,
            answer=None if req.thinking_end_time is None else end - req.thinking_end_time,
        )
        start = req.answer_start if req.answer_start is not None else len(req.tokens)
        answer_ids = req.tokens[start:]
        reasoning_ids = req.tokens[: req.reasoning_end if req.reasoning_end is not None else start]
        metrics: dict[str, Any] = {
            "prompt_tokens": len(req.prompt_ids),
            "output_tokens": len(req.tokens),
            "cot_tokens": req.cot_tokens,
            "answer_tokens": len(answer_ids),
            "thinking_closed_by": req.closed_by.value,
            "answer_forwards": req.answer_forwards,
            "forwards": req.forwards,
            "backend": "vllm",
        }
        if req.schedule is not None:
            metrics.update(req.schedule.report())
            metrics.update(
                accepted_prefix=0,
                suffix_accepted_tokens=0,
                answer_verify_steps=0,
                suffix_skipped_steps=0,
                proposed_tokens=0,
                accepted_tokens=0,
            )
            metrics.update({k: v for k, v in req.worker_metrics.items() if k != "answer_forwards"})
            metrics["accepted_prefix"] = min(metrics["accepted_prefix"], len(answer_ids))
        decode = self.tokenizer.decode
        return GenerationResult(
            request_id=req.request_id,
            prompt_token_ids=list(req.prompt_ids),
            token_ids=list(req.tokens),
            text=decode(req.tokens, skip_special_tokens=True),
            finish_reason=req.finish_reason,
            finish_detail=req.finish_detail,
            timings=timings,
            reasoning_text=decode(reasoning_ids, skip_special_tokens=True) if req.thinking else None,
            answer_text=decode(answer_ids, skip_special_tokens=True),
            answer_token_ids=answer_ids,
            metrics=metrics,
            logprobs=list(req.logprobs) if req.params.logprobs is not None else None,
        )

    def live_requests(self) -> dict[str, int]:
        """What is still held: driver requests, vLLM requests unfinished in the output processor,
        and per worker the runner's requests and the proposer's states (tests: nothing leaks)."""
        if not self.has_unfinished():
            # Workers learn of finished and aborted requests with the next scheduled step.
            self.engine.step()
        workers = self.engine.collective_rpc(_held_in_worker)
        return {
            "driver": len(self.requests),
            "vllm": self.engine.get_num_unfinished_requests(),
            "runner": max(w[0] for w in workers),
            "proposer": max(w[1] for w in workers),
        }


def _held_in_worker(worker: Any) -> tuple[int, int]:
    """The runner's requests and the proposer's states, after the sweep the proposer's next
    `propose` would run (it drops the states of requests the runner no longer has)."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if hasattr(drafter, "sweep"):
        drafter.sweep(runner.requests)
    return len(runner.requests), len(getattr(drafter, "states", {}))
