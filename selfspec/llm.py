"""The `LLM` facade: load a model, build prompts, run requests through the engine.

`LLM(model="smollm2").generate(prompts, SamplingParams(...), spec=...)` is the one entry point
that the CLI, the server and the benchmarks share. A `spec` (one of `selfspec.config.SpecConfig`:
SSR, suffix decoding, prompt lookup, draft model, CoSpec; or a dict with a `method` key) only
chooses the policy each request's sequence carries; the engine and the outputs' shape are the
same in every mode, which is what makes side-by-side ratios honest. A request that names no
`spec` runs "auto" (`selfspec.spec.auto`: SSR on thinking requests, prompt lookup elsewhere, as
the measured costs pay); `spec="off"` or `spec=None` decodes plainly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator
from typing import Sequence as Seq

import torch
from tqdm import tqdm

from selfspec.config import parse_spec
from selfspec.engine.config import EngineConfig
from selfspec.engine.heap import freeze_long_lived
from selfspec.engine.llm_engine import Engine, StepEvent
from selfspec.engine.logits_processing import TokenLogprob
from selfspec.engine.policy import SequencePolicy
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.sequence import Sequence
from selfspec.models import load_model
from selfspec.models.registry import get_model_entry
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.distilled_draft import load_draft_spec
from selfspec.spec.draft_gate import AcceptanceHistory
from selfspec.spec.draft_model import DraftModelRunner, shallow_draft
from selfspec.spec.suffix import GlobalSuffixHistory
from selfspec.thinking.format import ThinkingFormat, encode_prompt, thinking_enabled
from selfspec.thinking.policy import ThinkingLimits, ThinkingPolicy

Prompt = str | list[dict] | list[int]


@dataclass
class Timings:
    """Seconds, measured on the host around the engine loop."""

    ttft: float | None  # arrival -> first output token
    total: float  # arrival -> finish
    thinking: float | None = None  # arrival -> end of thinking
    first_answer_token: float | None = None  # arrival -> first answer token
    answer: float | None = None  # end of thinking -> finish


@dataclass
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    finish_detail: str
    timings: Timings
    reasoning_text: str | None = None
    answer_text: str | None = None
    answer_token_ids: list[int] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # Per output token, the forward shape that chose it (Sequence.output_shapes): a bf16 diagnostic.
    output_shapes: list[str] = field(default_factory=list)
    # Per output token when `SamplingParams.logprobs` is set: raw-model logprobs (None: a forced token).
    logprobs: list[TokenLogprob | None] | None = None


class LLM:
    """A model with its engine. Construct from a name/path, or wrap a loaded model (tests)."""

    def __init__(
        self,
        model: str = "smollm2",
        *,
        device: str = "cpu",
        dtype: str | torch.dtype = "float32",
        cache_dir: str | None = None,
        engine_config: EngineConfig | None = None,
        thinking_format: ThinkingFormat | None = None,
        think_start: str | None = None,
        think_end: str | None = None,
        draft: str | None = None,
        tokenizer: str | None = None,
    ) -> None:
        loaded = load_model(model, device=device, dtype=dtype, cache_dir=cache_dir, tokenizer=tokenizer)
        self._from_loaded(
            loaded,
            engine_config,
            thinking_format,
            think_start,
            think_end,
            draft,
            device=device,
            dtype=dtype,
            cache_dir=cache_dir,
        )

    @classmethod
    def from_loaded(
        cls,
        loaded,
        *,
        engine_config: EngineConfig | None = None,
        thinking_format: ThinkingFormat | None = None,
        draft: str | None = None,
    ) -> "LLM":
        """An LLM over an already loaded model (`selfspec.models.load_model`'s result).

        Why: a caller may need the tokenizer before it can size the engine — the benchmark
        fits `max_len` to its longest prompt — without loading the weights twice.
        """
        self = cls.__new__(cls)
        self._from_loaded(
            loaded, engine_config, thinking_format, None, None, draft, device=loaded.device, dtype=loaded.dtype
        )
        return self

    def _from_loaded(self, loaded, engine_config, thinking_format, think_start, think_end, draft, **draft_load) -> None:
        if thinking_format is None and think_start is None and think_end is None:
            thinking_format = loaded.thinking  # honours a registry entry's marker overrides
        self._init(loaded.model, loaded.tokenizer, engine_config, thinking_format, think_start, think_end)
        self.model_name = loaded.name
        entry = get_model_entry(loaded.name)
        # A packaged adapter was trained to think (e.g. smollm2-thinker): think unless told not to.
        self.thinks_by_default = entry is not None and entry.adapter_dir is not None
        if entry is not None and entry.end_of_turn_tokens and self.tokenizer is not None:
            vocab = self.tokenizer.get_vocab()
            extra = {vocab[t] for t in entry.end_of_turn_tokens if t in vocab}
            self.engine.eos_token_ids = frozenset(self.engine.eos_token_ids | extra)
        if draft is not None:
            self.set_draft(draft, **draft_load)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer=None,
        *,
        engine_config: EngineConfig | None = None,
        thinking_format: ThinkingFormat | None = None,
        name: str = "custom",
        draft: "str | torch.nn.Module | None" = None,
    ) -> "LLM":
        self = cls.__new__(cls)
        self._init(model, tokenizer, engine_config, thinking_format, None, None)
        self.model_name = name
        if draft is not None:
            self.set_draft(draft)
        return self

    def set_draft(self, draft: "str | torch.nn.Module", **load_kwargs) -> None:
        """Attach a draft model for SpS: "layers:N" (the target's first N layers + head,
        shared weights), "distilled:<dir>" or "layers:N+<dir>" (the same shape with a
        distilled LoRA merged into copies of those layers: `selfspec.spec.distilled_draft`),
        a loaded module, or a model name/path of the same vocabulary."""
        if isinstance(draft, str) and (
            draft.startswith("distilled:") or (draft.startswith("layers:") and "+" in draft)
        ):
            module = load_draft_spec(self.model, draft, compile_backend=self.engine.config.compile_backend)
        elif isinstance(draft, str) and draft.startswith("layers:"):
            module = shallow_draft(self.model, int(draft.split(":", 1)[1]))
        elif isinstance(draft, str):
            module = load_model(draft, **load_kwargs).model
        else:
            module = draft
        vocab = module.get_output_embeddings().weight.shape[0]
        if vocab != self.engine.vocab_size:
            raise ValueError(f"draft vocabulary ({vocab}) differs from the target's ({self.engine.vocab_size})")
        self.draft_runner = DraftModelRunner(
            module, num_slots=self.engine.config.num_slots, max_len=self.engine.max_len
        )
        # How the draft was named ("layers:N" or a model): arbitrator checkpoints record and check it.
        self.draft_spec = draft if isinstance(draft, str) else None

    def _init(self, model, tokenizer, engine_config, thinking_format, think_start, think_end) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.engine = Engine(model, tokenizer, engine_config)
        freeze_long_lived(self.engine.device)  # no full GC pass over the engine's objects mid-step
        # Past responses shared by requests that list "global" among their suffix sources.
        self.global_history = GlobalSuffixHistory(max_responses=256)
        self.draft_acceptance = AcceptanceHistory()  # SSR's cost gate learns how well drafts match here
        self.draft_runner: DraftModelRunner | None = None
        self.draft_spec: str | None = None
        self._grammars = None  # a GrammarCompiler, built on first use (the [structured] extra)
        if thinking_format is None and tokenizer is not None:
            thinking_format = ThinkingFormat.detect(tokenizer, override_start=think_start, override_end=think_end)
        self.thinking_format = thinking_format

    # ------------------------------------------------------------------ prompts
    def encode_prompt(
        self, prompt: Prompt, *, thinking: bool | None = None, tools: list[dict] | None = None
    ) -> list[int]:
        """Token ids for a prompt: raw ids pass through; text/messages go through the chat template
        (with `tools`, OpenAI function definitions, rendered by the template)."""
        enable = self._thinking_enabled(thinking)
        return encode_prompt(self.tokenizer, prompt, self.thinking_format, enable_thinking=enable, tools=tools)

    def thinking_enabled(self, thinking: bool | None) -> bool:
        """Whether a request asking `thinking` (None: the model's default) thinks first; its
        answer, not its reasoning, then follows a grammar (`submit(grammar=...)`)."""
        return self._thinking_enabled(thinking)

    def _thinking_enabled(self, thinking: bool | None) -> bool:
        return thinking_enabled(self.thinking_format, thinking, getattr(self, "thinks_by_default", False))

    @property
    def grammars(self):
        """The `selfspec.engine.grammar.GrammarCompiler` for this tokenizer (built once: ~0.3 s
        on a 49k vocabulary). Its grammars go to `submit(grammar=...)`."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise ValueError("constrained decoding needs a tokenizer")
            from selfspec.engine.grammar import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer, self.engine.vocab_size, self.engine.eos_token_ids)
        return self._grammars

    # ------------------------------------------------------------------ generation
    def make_policy(
        self,
        spec: MethodConfig | dict | str | None,
        limits: ThinkingLimits | None,
        thinking: bool,
        params: SamplingParams | None = None,
    ) -> SequencePolicy:
        """The per-request policy: a speculation config builds its own, else (None) plain thinking rules."""
        if spec is None:
            return ThinkingPolicy(self.thinking_format, limits, thinking=thinking)
        context = MethodContext(
            thinking_format=self.thinking_format,
            limits=limits,
            thinking=thinking,
            params=params or SamplingParams(),
            device=self.engine.device,
            global_history=self.global_history,
            draft_runner=self.draft_runner,
            draft_acceptance=self.draft_acceptance,
            step_costs=self.engine.step_costs,
            rows=self.engine.num_running + 1,
        )
        return parse_spec(spec).build(context)

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        spec: MethodConfig | dict | str | None = "auto",
        limits: ThinkingLimits | None = None,
        thinking: bool | None = None,
        request_id: str | None = None,
        grammar: Any = None,
    ) -> Sequence:
        """Queue one request without running the loop (the server and streaming use this).

        `grammar` (from `self.grammars`: a JSON schema, regex, EBNF or tool-call format) constrains
        the answer: with thinking on, it applies after the end-of-thinking marker. With
        `params.n > 1` the other samples are the returned sequence's `siblings`.
        """
        params = params or SamplingParams()
        spec = None if spec is None else parse_spec(spec)
        if thinking is None and spec is not None and spec.needs_thinking:
            thinking = True
        enable = self._thinking_enabled(thinking)
        if limits is not None:
            limits.validate()
            if limits.fixed_length:
                params.ignore_eos = True
        prompt_ids = self.encode_prompt(prompt, thinking=enable)
        policy = self.make_policy(spec, limits, enable, params)
        siblings = [self.make_policy(spec, _copy_limits(limits), enable, params) for _ in range(params.n - 1)]
        constraint = None
        if grammar is not None:
            thinks = isinstance(policy, ThinkingPolicy) and policy.thinking
            gate = self.thinking_format.end_variants if thinks else ()
            constraint = self.grammars.constraint(grammar, start=len(prompt_ids), open_after=gate)
        return self.engine.add_request(
            prompt_ids, params, request_id=request_id, policy=policy, constraint=constraint, sibling_policies=siblings
        )

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        spec: MethodConfig | dict | str | None = "auto",
        limits: ThinkingLimits | None = None,
        thinking: bool | None = None,
        progress: bool = False,
        on_event: Callable[[StepEvent], None] | None = None,
    ) -> list[GenerationResult]:
        """Run prompts to completion (continuous batching over the engine's slots)."""
        batch = _as_batch(prompts)
        if isinstance(params, SamplingParams) or params is None:
            params_list = [_copy_params(params or SamplingParams()) for _ in batch]
        else:
            params_list = list(params)
            if len(params_list) != len(batch):
                raise ValueError(f"{len(params_list)} sampling params for {len(batch)} prompts")
        seqs = [
            self.submit(p, sp, spec=spec, limits=_copy_limits(limits), thinking=thinking)
            for p, sp in zip(batch, params_list)
        ]
        self.run_until_done(seqs, progress=progress, on_event=on_event)
        return [self.result(s) for s in seqs]

    def run_until_done(self, seqs: list[Sequence], *, progress: bool = False, on_event=None) -> None:
        seqs = [member for seq in seqs for member in (seq, *seq.siblings)]  # n > 1: every sample
        bar = None
        if progress:
            bar = tqdm(total=len(seqs), desc="generate", unit="req")
        done = 0
        while not all(s.is_finished for s in seqs):
            for event in self.engine.step():
                if on_event is not None:
                    on_event(event)
            if bar is not None:
                now = sum(s.is_finished for s in seqs)
                bar.update(now - done)
                done = now
        if bar is not None:
            bar.close()

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        spec: MethodConfig | dict | str | None = "auto",
        limits: ThinkingLimits | None = None,
        thinking: bool | None = None,
    ) -> Iterator[list[int]]:
        """Submit one request and yield the token ids it commits, step by step."""
        seq = self.submit(prompt, params, spec=spec, limits=limits, thinking=thinking)
        yield from self.iter_tokens(seq)

    def iter_tokens(self, seq: Sequence) -> Iterator[list[int]]:
        """Drive the engine until `seq` finishes, yielding its newly committed token ids.

        Other queued requests advance in the same steps. A cap may truncate tokens committed
        in the same step, so only what stands after the policy ran is yielded.
        """
        sent = seq.prompt_len
        while not seq.is_finished:
            self.engine.step()
            if len(seq.token_ids) > sent:
                yield seq.token_ids[sent:]
                sent = len(seq.token_ids)
        if len(seq.token_ids) > sent:
            yield seq.token_ids[sent:]

    # ------------------------------------------------------------------ results
    def result(self, seq: Sequence) -> GenerationResult:
        out = seq.output_ids
        policy = seq.policy
        metrics: dict[str, Any] = {
            "prompt_tokens": seq.prompt_len,
            "output_tokens": len(out),
            "forwards": seq.stats.forwards,
            "proposed_tokens": seq.stats.proposed_tokens,
            "accepted_tokens": seq.stats.accepted_tokens,
            "verify_steps": seq.stats.verify_steps,
        }
        timings = Timings(
            ttft=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
            total=(seq.finish_time or time.perf_counter()) - seq.arrival_time,
        )
        reasoning_text = answer_text = None
        answer_ids = None
        if isinstance(policy, ThinkingPolicy):
            pm = policy.metrics
            metrics.update(
                cot_tokens=pm.cot_tokens, answer_tokens=pm.answer_tokens, thinking_closed_by=pm.thinking_closed_by.value
            )
            metrics.update(policy.report())
            if pm.thinking_end_time is not None:
                timings.thinking = pm.thinking_end_time - seq.arrival_time
                timings.answer = (seq.finish_time or time.perf_counter()) - pm.thinking_end_time
            if pm.first_answer_token_time is not None:
                timings.first_answer_token = pm.first_answer_token_time - seq.arrival_time
            if policy.thinking:
                start = pm.answer_start if pm.answer_start is not None else len(seq.token_ids)
                if pm.answer_start is None and pm.thinking_end_time is not None:
                    start = len(seq.token_ids)  # thinking closed, no answer token yet
                answer_ids = seq.token_ids[start:]
                end = pm.reasoning_end if pm.reasoning_end is not None else start
                reasoning_ids = seq.token_ids[seq.prompt_len : end]
                if self.tokenizer is not None:
                    reasoning_text = self.tokenizer.decode(reasoning_ids, skip_special_tokens=True)
                    answer_text = self.tokenizer.decode(answer_ids, skip_special_tokens=True)
            else:
                answer_ids = out
        text = self.tokenizer.decode(out, skip_special_tokens=True) if self.tokenizer is not None else ""
        if seq.params.stop and seq.finish_detail == "stop string":
            text = _cut_at_stop(text, seq.params.stop)
            if answer_text is not None:
                answer_text = _cut_at_stop(answer_text, seq.params.stop)
        if answer_text is None and answer_ids is not None and self.tokenizer is not None:
            answer_text = text
        return GenerationResult(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.prompt_len],
            token_ids=out,
            text=text,
            finish_reason=seq.finish_reason.value if seq.finish_reason else "running",
            finish_detail=seq.finish_detail,
            timings=timings,
            reasoning_text=reasoning_text,
            answer_text=answer_text,
            answer_token_ids=answer_ids,
            metrics=metrics,
            output_shapes=list(seq.output_shapes),
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        )


def _as_batch(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], dict):
        return [prompts]  # one chat
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
        return [prompts]  # one tokenized prompt
    batch = list(prompts)
    if not batch:
        raise ValueError("no prompts given")
    return batch


def _copy_params(p: SamplingParams) -> SamplingParams:
    return replace(p, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids))


def _copy_limits(limits: ThinkingLimits | None) -> ThinkingLimits | None:
    return None if limits is None else replace(limits)


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text if cut < 0 else text[:cut]
